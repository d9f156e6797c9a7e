//! A vector that stores a single element inline: most managers have one node, and a round's per-node state
//! then needs no heap allocation.

use std::ops::{Deref, DerefMut};

/// One element per node: inline for one node, on the heap for more.
#[derive(Debug, Clone)]
pub(crate) enum Slots<T> {
    One([T; 1]),
    Many(Vec<T>),
}

impl<T> Slots<T> {
    /// `n` elements made by `f(index)`.
    pub(crate) fn from_fn(n: usize, mut f: impl FnMut(usize) -> T) -> Self {
        if n == 1 {
            Slots::One([f(0)])
        } else {
            Slots::Many((0..n).map(f).collect())
        }
    }
}

impl<T> Deref for Slots<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Slots::One(one) => one,
            Slots::Many(many) => many,
        }
    }
}

impl<T> DerefMut for Slots<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Slots::One(one) => one,
            Slots::Many(many) => many,
        }
    }
}

impl<T> IntoIterator for Slots<T> {
    type Item = T;
    type IntoIter = SlotsIter<T>;

    fn into_iter(self) -> SlotsIter<T> {
        match self {
            Slots::One(one) => SlotsIter::One(one.into_iter()),
            Slots::Many(many) => SlotsIter::Many(many.into_iter()),
        }
    }
}

/// The owning iterator of [`Slots`].
pub(crate) enum SlotsIter<T> {
    One(std::array::IntoIter<T, 1>),
    Many(std::vec::IntoIter<T>),
}

impl<T> Iterator for SlotsIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self {
            SlotsIter::One(it) => it.next(),
            SlotsIter::Many(it) => it.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_inline_and_many_behave_like_a_vec() {
        let mut one = Slots::from_fn(1, |i| i + 10);
        assert!(matches!(one, Slots::One(_)));
        one[0] += 1;
        assert_eq!(&*one, &[11]);
        assert_eq!(one.into_iter().collect::<Vec<_>>(), vec![11]);
        let many = Slots::from_fn(3, |i| i * 2);
        assert_eq!(&*many, &[0, 2, 4]);
        assert_eq!(many.into_iter().collect::<Vec<_>>(), vec![0, 2, 4]);
        assert!(Slots::from_fn(0, |i| i).is_empty());
    }
}
