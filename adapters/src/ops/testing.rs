//! Test doubles shared by the operations' unit tests: a scripted transport and a minimal executor.

use std::sync::{Arc, Mutex};

use redlease::NodeError;

use crate::scripts::{Reply, Script};
use crate::{Capabilities, Commands};
use std::collections::VecDeque;

use super::{Probe, Transport, Verb};

/// A transport that answers from a script of replies and records what was sent.
#[derive(Default)]
pub(super) struct Scripted {
    pub(super) probe: Probe,
    pub(super) replies: Mutex<VecDeque<Result<Reply, NodeError>>>,
    pub(super) txs: Mutex<VecDeque<Result<Vec<Reply>, NodeError>>>,
    pub(super) sent: Mutex<Vec<String>>,
    pub(super) tx_args: Mutex<Vec<Vec<Vec<String>>>>,
    /// The replies of the second command of `command_and_publish` (`Int(0)`, "no waiter", when empty).
    pub(super) seconds: Mutex<VecDeque<Option<Reply>>>,
    /// What [`Transport::connection_id`] names (`None`: a connection the client may replace unnoticed).
    pub(super) conn: Mutex<Option<u64>>,
}

impl Transport for Scripted {
    async fn script_once(
        &self,
        _: Verb,
        script: &Script,
        _: &[&str],
        _: &[&str],
    ) -> Result<Reply, NodeError> {
        panic!("no script may run here: {}", script.name)
    }
    async fn command(&self, _: &Script, _: &str, args: &[&str]) -> Result<Reply, NodeError> {
        self.sent.lock().unwrap().push(args[0].to_owned());
        self.replies.lock().unwrap().pop_front().expect("a reply")
    }
    async fn transaction(
        &self,
        _: &Script,
        _: &str,
        cmds: &[&[&str]],
    ) -> Result<Vec<Reply>, NodeError> {
        let names: Vec<&str> = cmds.iter().map(|c| c[0]).collect();
        self.tx_args.lock().unwrap().push(
            cmds.iter()
                .map(|c| c.iter().map(|a| (*a).to_owned()).collect())
                .collect(),
        );
        self.sent
            .lock()
            .unwrap()
            .push(format!("MULTI {}", names.join(" ")));
        self.txs
            .lock()
            .unwrap()
            .pop_front()
            .expect("a transaction reply")
    }
    async fn command_and_publish(
        &self,
        _: &Script,
        _: &str,
        args: &[&str],
        publish: &[&str],
    ) -> Result<(Reply, Option<Reply>), NodeError> {
        self.sent
            .lock()
            .unwrap()
            .push(format!("{}+{}", args[0], publish[0]));
        self.tx_args.lock().unwrap().push(vec![
            args.iter().map(|a| (*a).to_owned()).collect(),
            publish.iter().map(|a| (*a).to_owned()).collect(),
        ]);
        let second = self
            .seconds
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Some(Reply::Int(0)));
        self.replies
            .lock()
            .unwrap()
            .pop_front()
            .expect("a reply")
            .map(|r| (r, second))
    }
    fn clustered(&self) -> bool {
        false
    }
    fn probe(&self) -> &Probe {
        &self.probe
    }
    fn connection_id(&self, _: &str) -> Option<u64> {
        *self.conn.lock().unwrap()
    }
}

pub(super) fn native() -> Scripted {
    let t = Scripted::default();
    t.probe.set_mode(Commands::Native);
    // The fence key "f" known writable (its check is `fence_writable`'s own transaction).
    t.probe.lock().writable_fences.insert("f".to_owned());
    t.probe.set(Capabilities {
        lua: false,
        set_nx_get: true,
        set_ifeq: true,
        delifeq: true,
        commands: Commands::Native,
    });
    t
}

/// A minimal executor for futures that never wait (the scripted transport answers at once).
pub(super) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

pub(super) fn time(millis: u64) -> Result<Reply, NodeError> {
    Ok(Reply::Array(vec![
        Reply::Bytes((millis / 1000).to_string().into_bytes()),
        Reply::Bytes(((millis % 1000) * 1000).to_string().into_bytes()),
    ]))
}

pub(super) fn scored(members: &[(&str, u64)]) -> Result<Reply, NodeError> {
    Ok(Reply::Array(
        members
            .iter()
            .flat_map(|(m, s)| {
                [
                    Reply::Bytes(m.as_bytes().to_vec()),
                    Reply::Bytes(s.to_string().into_bytes()),
                ]
            })
            .collect(),
    ))
}

pub(super) fn members(list: &[(&str, u64)]) -> Vec<(Vec<u8>, u64)> {
    list.iter()
        .map(|(m, s)| (m.as_bytes().to_vec(), *s))
        .collect()
}
