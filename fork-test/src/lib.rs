//! No library: this package only holds `tests/fork.rs`, which forks the test process for real to check that
//! redlease's default timer works in the child (see that file).
