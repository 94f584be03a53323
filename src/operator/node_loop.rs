//! The leader's one CiliumNode loop, for cluster-pool and multi-pool alike
//! (Cilium's one watcher with a node-event handler per allocator). It hands
//! every change of the watched CiliumNodes to the allocator's [`NodeHandler`]
//! (a relist once complete, through a [`Relist`]), and writes what each node
//! needs through a [`NodeWriter`]. The watch's first list is the re-read of
//! every CiliumNode: what they hold is re-adopted before anything is allocated,
//! and while any list is being read, writes wait for its end (the list may still
//! change what a node needs).
//!
//! What the loop makes of a node is the handler's view of it
//! ([`NodeHandler::Node`]: its name and the few fields the allocator plans
//! from), made as each event or write answer arrives: the whole object
//! (metadata with managedFields, spec, status) is dropped there. The view goes
//! to the handler, which keeps what it needs; the loop keeps no copy of the
//! nodes (only the views of a list in progress, until it is complete).
//!
//! Events that have already arrived are taken together (up to [`EVENT_BATCH`]),
//! and the writes they call for (one per node, different nodes) go out
//! [`WRITE_CONCURRENCY`] at a time: a burst of new nodes costs one write each
//! and is paced by the API server, not by one round trip after the other. A write
//! refused because the node is gone or changed ([`Refusal`]) is the handler's to
//! judge: left to the watch, or the node is read again and planned again (at
//! most [`CONFLICTS_IN_A_ROW`] times in a row); any other failure is retried per
//! node with the operator's backoff ([`WriteRetries`]). A write that went
//! through may let go of what other nodes wait for ([`NodeHandler::written`]
//! names them): they are planned in the same pass.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

use super::metrics::OperatorMetrics;
use super::retry::WriteRetries;
use crate::controller::sleep_until;
use crate::k8s::mirror::{Keyed, Relist, Step, WatchEnded};
use crate::resources::NodeResource;

/// Writes in flight at once (different nodes).
pub const WRITE_CONCURRENCY: usize = 16;
/// At most this many events that have already arrived are taken before writing.
pub const EVENT_BATCH: usize = 1024;
/// Conflicts in a row after which a node waits for the retry timer.
pub const CONFLICTS_IN_A_ROW: usize = 5;

/// The annotation that makes the operator leave a CiliumNode alone (Cilium's).
pub const IGNORE_ANNOTATION: &str = "ipam.cilium.io/ignore";

/// Whether a CiliumNode with these annotations is to be left alone.
pub fn ignored(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(IGNORE_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// Whether resourceVersion `a` is older than `b` (both numbers, as Kubernetes
/// guarantees since 1.35; anything else is never older).
pub fn older(a: &str, b: &str) -> bool {
    match (a.parse::<u128>(), b.parse::<u128>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

/// Why the API server refused a node's write without it being a failure to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 404: the node is gone (the watch brings its deletion).
    Gone,
    /// 409: the node changed since it was read, or was replaced.
    Conflict,
}

impl Refusal {
    /// The refusal a failed write means, if it is one.
    pub fn of(e: &kube::Error) -> Option<Refusal> {
        match e {
            kube::Error::Api(s) if s.is_not_found() => Some(Refusal::Gone),
            kube::Error::Api(s) if s.is_conflict() => Some(Refusal::Conflict),
            _ => None,
        }
    }
}

/// What the loop does after a [`Refusal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Nothing: the watch brings what changed.
    LeaveToWatch,
    /// Read the node again and plan again.
    ReadAgain,
}

/// How a node's write did not go through.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the node is gone or changed ({0:?})")]
    Refused(Refusal),
    #[error("writing CiliumNode {node:?}: {source}")]
    Failed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("{CONFLICTS_IN_A_ROW} conflicts in a row writing CiliumNode {node:?}")]
    Conflicts { node: String },
}

impl WriteError {
    /// A failed write of `node`: a refusal when it is one.
    pub fn of(node: &str, source: kube::Error) -> WriteError {
        match Refusal::of(&source) {
            Some(r) => WriteError::Refused(r),
            None => WriteError::Failed {
                node: node.to_string(),
                source,
            },
        }
    }
}

/// What one node's writes left behind (whole objects: the loop keeps only the
/// handler's view of them).
#[derive(Debug)]
pub struct Written {
    /// The objects the API server answered with (newer than what was watched).
    pub objects: Vec<NodeResource>,
    /// Whether every write went through.
    pub outcome: Result<(), WriteError>,
}

impl Default for Written {
    fn default() -> Written {
        Written {
            objects: Vec::new(),
            outcome: Ok(()),
        }
    }
}

impl Written {
    /// What went through so far, and then `e`.
    pub fn failed(mut self, e: WriteError) -> Written {
        self.outcome = Err(e);
        self
    }
}

/// One allocator's side of the loop: what it makes of each CiliumNode and what
/// it says to write. No I/O.
pub trait NodeHandler {
    /// What the allocator reads of a CiliumNode (its name, identity and the
    /// fields it plans from): all the loop makes of a node.
    type Node: Keyed + for<'a> From<&'a NodeResource>;
    /// What one node's CiliumNode must be changed to.
    type Write;
    /// What else the allocator follows (multi-pool: the pool definitions).
    type Input;

    /// A node as listed or watched; returns the nodes that may need writes.
    fn upsert(&mut self, node: Self::Node) -> Vec<String>;
    /// A node was deleted; returns the nodes that may need writes.
    fn delete(&mut self, name: &str) -> Vec<String>;
    /// A (re)list is complete: `listed` are all the nodes there are (each was
    /// upserted); `first`: the first list. Returns the nodes that may need writes.
    fn relisted(&mut self, listed: &BTreeSet<String>, first: bool) -> Vec<String>;
    /// Something else it follows changed; returns the nodes that may need writes.
    fn input(&mut self, input: Self::Input) -> Vec<String>;
    /// What `name` needs written, if anything (what it carves is the node's from now on).
    fn plan(&mut self, name: &str) -> Option<Self::Write>;
    /// Every write of `write` went through; returns the nodes that may need
    /// writes (what the write let go of may be theirs now).
    fn written(&mut self, name: &str, write: &Self::Write) -> Vec<String>;
    /// A write of `name` was refused: what the refusal means to the allocator.
    fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal;
    /// A write of `name` failed (it is tried again after its backoff, planned
    /// anew). Nothing to do for an allocator that plans from what it holds.
    fn failed(&mut self, _name: &str) {}
    /// Publishes the allocator's gauges.
    fn report(&self, metrics: &OperatorMetrics);
}

/// Where the loop's writes go (the API server, or memory in tests).
pub trait NodeWriter<W> {
    /// Writes what `name` needs.
    fn write(&self, name: &str, write: &W) -> impl Future<Output = Written>;
    /// Reads `name` again (None: it is gone).
    fn read(&self, name: &str) -> impl Future<Output = Result<Option<NodeResource>, kube::Error>>;
}

/// Runs until the node watch ends (it does not while the API server can be
/// retried), or `inputs` says its own watch ended; returns which. `inputs`
/// ending without saying so only means nothing more comes from it.
pub async fn run<H, W, N, I>(
    handler: &mut H,
    writer: &W,
    nodes: N,
    inputs: I,
    metrics: &OperatorMetrics,
) -> WatchEnded
where
    H: NodeHandler,
    W: NodeWriter<H::Write>,
    N: Stream<Item = Result<Event<NodeResource>, watcher::Error>> + Unpin,
    I: Stream<Item = Result<H::Input, WatchEnded>> + Unpin,
{
    let mut nodes = nodes;
    let mut inputs = inputs.fuse();
    let mut watched = Relist::<H::Node>::default();
    let mut retry = WriteRetries::default();
    let mut first_list = true;
    loop {
        let due = retry.next_due().filter(|_| writable(&watched));
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        let first = tokio::select! {
            item = nodes.next() => Some(item),
            Some(input) = inputs.next() => match input {
                Ok(input) => {
                    dirty.extend(handler.input(input));
                    None
                }
                Err(ended) => return ended,
            },
            _ = sleep_until(due) => {
                dirty.extend(retry.due_at(Instant::now()));
                None
            }
        };
        // Take what else has already arrived too, so that a burst of new nodes
        // is written as one batch.
        let arrived = std::iter::from_fn(|| nodes.next().now_or_never()).take(EVENT_BATCH);
        for item in first.into_iter().chain(arrived) {
            let item = item.map(|event| event.map(viewed));
            let step = match watched.take(item, "CiliumNode") {
                Ok(s) => s,
                Err(ended) => return ended,
            };
            match step {
                Step::Nothing => {}
                // A list in progress replaces everything before it: the
                // handler sees it once complete.
                Step::Applied(_) | Step::Deleted(_) if watched.listing() => {}
                Step::Applied(node) => dirty.extend(handler.upsert(node)),
                Step::Deleted(node) => {
                    let name = node.key();
                    retry.succeeded(&name);
                    dirty.extend(handler.delete(&name));
                }
                Step::Relisted(all) => {
                    let mut listed = BTreeSet::new();
                    for (name, node) in all {
                        handler.upsert(node);
                        listed.insert(name);
                    }
                    let first = std::mem::take(&mut first_list);
                    dirty.extend(handler.relisted(&listed, first));
                }
            }
        }
        if !writable(&watched) {
            continue;
        }
        write_all(handler, writer, &mut retry, dirty).await;
        handler.report(metrics);
    }
}

/// The event with the handler's view of its node (the object is dropped here).
fn viewed<V: for<'a> From<&'a NodeResource>>(event: Event<NodeResource>) -> Event<V> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(node) => Event::InitApply(V::from(&node)),
        Event::InitDone => Event::InitDone,
        Event::Apply(node) => Event::Apply(V::from(&node)),
        Event::Delete(node) => Event::Delete(V::from(&node)),
    }
}

/// Whether writes may go out: a whole list was read and none is in progress.
fn writable<K: Keyed>(watched: &Relist<K>) -> bool {
    watched.listed && !watched.listing()
}

/// One node's writes as they come back: what the API server answered, as the
/// handler's views.
struct Answered<N, W> {
    name: String,
    write: W,
    nodes: Vec<N>,
    outcome: Result<(), WriteError>,
}

/// Plans and writes what the `dirty` nodes need, [`WRITE_CONCURRENCY`] at a
/// time; the nodes whose write was refused with a conflict the handler reads
/// again, and those a write that went through may concern (the handler says
/// which), are planned and written again, in the next round.
async fn write_all<H, W>(
    handler: &mut H,
    writer: &W,
    retry: &mut WriteRetries,
    dirty: BTreeSet<String>,
) where
    H: NodeHandler,
    W: NodeWriter<H::Write>,
{
    let mut conflicts: BTreeMap<String, usize> = BTreeMap::new();
    let mut names: Vec<String> = dirty.into_iter().collect();
    while !names.is_empty() {
        let mut jobs = Vec::new();
        for name in names.drain(..) {
            match handler.plan(&name) {
                Some(write) => jobs.push((name, write)),
                None => retry.succeeded(&name),
            }
        }
        // Each answer is cut down to the handler's view and handed to the
        // handler as it arrives: a batch keeps no answers.
        let mut answers = futures::stream::iter(jobs)
            .map(|(name, write)| async move {
                let written = writer.write(&name, &write).await;
                Answered {
                    nodes: written.objects.iter().map(H::Node::from).collect(),
                    outcome: written.outcome,
                    name,
                    write,
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY);
        let mut read_again = Vec::new();
        let mut next = BTreeSet::new();
        while let Some(Answered {
            name,
            write,
            nodes,
            outcome,
        }) = answers.next().await
        {
            for node in nodes {
                handler.upsert(node);
            }
            match outcome {
                Ok(()) => {
                    next.extend(handler.written(&name, &write));
                    retry.succeeded(&name);
                }
                Err(WriteError::Refused(why)) => match handler.refused(&name, why) {
                    AfterRefusal::LeaveToWatch => retry.succeeded(&name),
                    AfterRefusal::ReadAgain => read_again.push(name),
                },
                Err(e) => failed(handler, retry, &name, &e),
            }
        }
        for name in read_again {
            let in_a_row = conflicts.entry(name.clone()).or_default();
            *in_a_row += 1;
            if *in_a_row >= CONFLICTS_IN_A_ROW {
                let e = WriteError::Conflicts { node: name.clone() };
                failed(handler, retry, &name, &e);
                continue;
            }
            tracing::debug!(node = %name, "the node changed since it was read; reading it again");
            match writer.read(&name).await {
                Ok(Some(node)) => {
                    handler.upsert(H::Node::from(&node));
                    next.insert(name);
                }
                Ok(None) => {
                    handler.refused(&name, Refusal::Gone);
                    retry.succeeded(&name);
                }
                Err(source) => failed(
                    handler,
                    retry,
                    &name,
                    &WriteError::Failed {
                        node: name.clone(),
                        source,
                    },
                ),
            }
        }
        names.extend(next);
    }
}

/// A node's write failed: it is tried again after its backoff.
fn failed<H: NodeHandler>(handler: &mut H, retry: &mut WriteRetries, name: &str, e: &WriteError) {
    handler.failed(name);
    let backoff = retry.failed(name);
    tracing::warn!(node = %name, error = %e, retry_in = ?backoff, "writing the node's CiliumNode failed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;
    use std::time::Duration;

    use futures::stream;

    use crate::controller::Backoff;

    /// What [`Toy`] reads of a node: whether it carries `written: yes`.
    #[derive(Debug, Clone)]
    struct ToyNode {
        name: String,
        done: bool,
    }

    impl From<&NodeResource> for ToyNode {
        fn from(node: &NodeResource) -> ToyNode {
            let written = node.metadata.annotations.get("written");
            ToyNode {
                name: node.metadata.name.clone(),
                done: written.map(String::as_str) == Some("yes"),
            }
        }
    }

    impl Keyed for ToyNode {
        fn key(&self) -> String {
            self.name.clone()
        }
    }

    /// A handler that wants every node to carry the annotation `written: yes`.
    struct Toy {
        seen: BTreeMap<String, ToyNode>,
        after_refusal: AfterRefusal,
        relists: Vec<(usize, bool)>,
        refusals: Vec<(String, Refusal)>,
        written: Vec<String>,
        /// What `written` of a node says to plan again (once).
        after_written: BTreeMap<String, Vec<String>>,
    }

    impl Toy {
        fn new(after_refusal: AfterRefusal) -> Toy {
            Toy {
                seen: BTreeMap::new(),
                after_refusal,
                relists: Vec::new(),
                refusals: Vec::new(),
                written: Vec::new(),
                after_written: BTreeMap::new(),
            }
        }
    }

    impl NodeHandler for Toy {
        type Node = ToyNode;
        type Write = String;
        /// Nodes to plan again.
        type Input = Vec<String>;

        fn upsert(&mut self, node: ToyNode) -> Vec<String> {
            let name = node.name.clone();
            self.seen.insert(node.name.clone(), node);
            vec![name]
        }

        fn delete(&mut self, name: &str) -> Vec<String> {
            self.seen.remove(name);
            Vec::new()
        }

        fn relisted(&mut self, listed: &BTreeSet<String>, first: bool) -> Vec<String> {
            self.relists.push((listed.len(), first));
            self.seen.retain(|n, _| listed.contains(n));
            listed.iter().cloned().collect()
        }

        fn input(&mut self, names: Vec<String>) -> Vec<String> {
            names
        }

        fn plan(&mut self, name: &str) -> Option<String> {
            let node = self.seen.get(name)?;
            (!node.done).then(|| "yes".to_string())
        }

        fn written(&mut self, name: &str, _write: &String) -> Vec<String> {
            self.written.push(name.to_string());
            self.after_written.remove(name).unwrap_or_default()
        }

        fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal {
            self.refusals.push((name.to_string(), why));
            self.after_refusal
        }

        fn report(&self, _metrics: &OperatorMetrics) {}
    }

    /// The API server in memory: its nodes, the failures to answer next per
    /// node, and how many writes ran at once.
    #[derive(Default)]
    struct Memory {
        nodes: RefCell<BTreeMap<String, NodeResource>>,
        failures: RefCell<BTreeMap<String, VecDeque<WriteError>>>,
        attempts: RefCell<Vec<String>>,
        in_flight: Cell<usize>,
        most_in_flight: Cell<usize>,
    }

    impl Memory {
        fn with(names: &[String]) -> Memory {
            let m = Memory::default();
            for n in names {
                m.nodes.borrow_mut().insert(n.clone(), NodeResource::new(n));
            }
            m
        }

        fn fail(&self, name: &str, errors: impl IntoIterator<Item = WriteError>) {
            self.failures
                .borrow_mut()
                .entry(name.to_string())
                .or_default()
                .extend(errors);
        }

        fn attempts(&self, name: &str) -> usize {
            self.attempts.borrow().iter().filter(|n| *n == name).count()
        }
    }

    impl NodeWriter<String> for Memory {
        async fn write(&self, name: &str, write: &String) -> Written {
            self.in_flight.set(self.in_flight.get() + 1);
            self.most_in_flight
                .set(self.most_in_flight.get().max(self.in_flight.get()));
            tokio::task::yield_now().await;
            self.in_flight.set(self.in_flight.get() - 1);
            self.attempts.borrow_mut().push(name.to_string());
            let failure = self
                .failures
                .borrow_mut()
                .get_mut(name)
                .and_then(VecDeque::pop_front);
            if let Some(e) = failure {
                return Written::default().failed(e);
            }
            let mut nodes = self.nodes.borrow_mut();
            let Some(node) = nodes.get_mut(name) else {
                return Written::default().failed(WriteError::Refused(Refusal::Gone));
            };
            node.metadata
                .annotations
                .insert("written".into(), write.clone());
            Written {
                objects: vec![node.clone()],
                outcome: Ok(()),
            }
        }

        async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
            Ok(self.nodes.borrow().get(name).cloned())
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:02}")).collect()
    }

    /// The first list of `names`.
    fn listed(names: &[String]) -> Vec<Result<Event<NodeResource>, watcher::Error>> {
        let mut events = vec![Ok(Event::Init)];
        events.extend(
            names
                .iter()
                .map(|n| Ok(Event::InitApply(NodeResource::new(n)))),
        );
        events.push(Ok(Event::InitDone));
        events
    }

    fn failed() -> WriteError {
        WriteError::Failed {
            node: "n".into(),
            source: kube::Error::Service("the API server is down".into()),
        }
    }

    /// Runs the loop over `events` (then a watch that stays open) and
    /// `inputs` for `time` (paused: it passes when nothing else can happen).
    async fn run_for(
        toy: &mut Toy,
        memory: &Memory,
        events: Vec<Result<Event<NodeResource>, watcher::Error>>,
        inputs: Vec<Result<Vec<String>, WatchEnded>>,
        time: Duration,
    ) -> Option<WatchEnded> {
        let nodes = stream::iter(events).chain(stream::pending());
        let metrics = OperatorMetrics::new();
        let running = run(toy, memory, nodes, stream::iter(inputs), &metrics);
        tokio::time::timeout(time, running).await.ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_written_as_one_batch_after_the_first_list() {
        let all = names(40);
        let memory = Memory::with(&all);
        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        // A list in progress: nothing is written yet.
        let mut started = listed(&all);
        started.pop();
        run_for(
            &mut toy,
            &memory,
            started,
            Vec::new(),
            Duration::from_secs(1),
        )
        .await;
        assert!(memory.attempts.borrow().is_empty());
        assert!(toy.seen.is_empty(), "a list is seen once complete");

        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        run_for(
            &mut toy,
            &memory,
            listed(&all),
            Vec::new(),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(toy.relists, [(40, true)]);
        toy.written.sort();
        assert_eq!(toy.written, all, "one write each");
        assert_eq!(memory.most_in_flight.get(), WRITE_CONCURRENCY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_forgets_the_nodes_deleted_meanwhile_and_a_watch_error_is_survived() {
        let all = names(3);
        let memory = Memory::with(&all);
        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        let mut events = listed(&all);
        events.push(Err(watcher::Error::NoResourceVersion));
        events.extend(listed(&all[..1]));
        events.push(Ok(Event::Apply(NodeResource::new("n09"))));
        events.push(Ok(Event::Delete(NodeResource::new("n00"))));
        run_for(
            &mut toy,
            &memory,
            events,
            Vec::new(),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(toy.relists, [(3, true), (1, false)]);
        assert_eq!(toy.seen.keys().collect::<Vec<_>>(), ["n09"]);
        // n09 is not on the API server: its write finds it gone.
        assert_eq!(toy.refusals, [("n09".to_string(), Refusal::Gone)]);
        assert_eq!(memory.attempts("n09"), 1);
    }

    /// The loop over the first list of `count` nodes, with the first writes of
    /// n00 answered with `failures`, for `time`.
    async fn first_list(
        count: usize,
        failures: Vec<WriteError>,
        after: AfterRefusal,
        time: Duration,
    ) -> (Toy, Memory) {
        let all = names(count);
        let memory = Memory::with(&all);
        memory.fail("n00", failures);
        let mut toy = Toy::new(after);
        run_for(&mut toy, &memory, listed(&all), Vec::new(), time).await;
        (toy, memory)
    }

    #[test]
    fn resource_versions_compare_as_numbers() {
        assert!(older("9", "10"));
        assert!(!older("10", "9"));
        assert!(!older("10", "10"));
        assert!(!older("x", "10"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_retried_after_its_backoff() {
        let leave = AfterRefusal::LeaveToWatch;
        // Not due yet: one attempt.
        let (toy, memory) =
            first_list(2, vec![failed(), failed()], leave, Backoff::API.first / 2).await;
        assert_eq!(memory.attempts("n00"), 1);
        assert_eq!(toy.written, ["n01"]);
        let (toy, memory) =
            first_list(2, vec![failed(), failed()], leave, Backoff::API.first * 4).await;
        assert_eq!(memory.attempts("n00"), 3);
        assert_eq!(toy.written, ["n01", "n00"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_nodes_a_write_concerns_are_planned_again_in_the_same_pass() {
        let all = names(2);
        let memory = Memory::with(&all);
        // n01's first write fails: it waits for its backoff...
        memory.fail("n01", vec![failed()]);
        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        // ...unless n00's write concerns it (it let go of what n01 waits for).
        toy.after_written.insert("n00".into(), vec!["n01".into()]);
        run_for(
            &mut toy,
            &memory,
            listed(&all),
            Vec::new(),
            Backoff::API.first / 2,
        )
        .await;
        assert_eq!(memory.attempts("n01"), 2);
        assert_eq!(toy.written, ["n00", "n01"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_is_left_to_the_watch_or_read_and_planned_again() {
        let conflicts = |n: usize| {
            (0..n)
                .map(|_| WriteError::Refused(Refusal::Conflict))
                .collect()
        };
        let time = Duration::from_secs(5);

        let (toy, memory) = first_list(1, conflicts(1), AfterRefusal::LeaveToWatch, time).await;
        assert_eq!(memory.attempts("n00"), 1);
        assert_eq!(toy.refusals, [("n00".to_string(), Refusal::Conflict)]);
        assert!(toy.written.is_empty());

        let (toy, memory) = first_list(1, conflicts(1), AfterRefusal::ReadAgain, time).await;
        assert_eq!(memory.attempts("n00"), 2);
        assert_eq!(toy.written, ["n00"]);

        // Conflicts in a row: the node waits for its retry, then goes through.
        let in_a_row = conflicts(CONFLICTS_IN_A_ROW);
        let (toy, memory) =
            first_list(1, in_a_row, AfterRefusal::ReadAgain, Backoff::API.first / 2).await;
        assert_eq!(memory.attempts("n00"), CONFLICTS_IN_A_ROW);
        assert!(toy.written.is_empty());
        let in_a_row = conflicts(CONFLICTS_IN_A_ROW);
        let (toy, memory) =
            first_list(1, in_a_row, AfterRefusal::ReadAgain, Backoff::API.first * 2).await;
        assert_eq!(memory.attempts("n00"), CONFLICTS_IN_A_ROW + 1);
        assert_eq!(toy.written, ["n00"]);
    }

    #[tokio::test(start_paused = true)]
    async fn inputs_plan_again_and_a_watch_that_ends_ends_the_loop() {
        let all = names(2);
        let memory = Memory::with(&all);
        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        let ended = WatchEnded {
            kind: "CiliumPodIPPool".into(),
        };
        let inputs = vec![Ok(vec!["n00".to_string()]), Err(ended.clone())];
        let got = run_for(
            &mut toy,
            &memory,
            Vec::new(),
            inputs,
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(got, Some(ended));
        assert!(
            memory.attempts.borrow().is_empty(),
            "no list yet: no writes"
        );

        let mut toy = Toy::new(AfterRefusal::LeaveToWatch);
        let nodes = stream::iter(listed(&all));
        let metrics = OperatorMetrics::new();
        let got = run(&mut toy, &memory, nodes, stream::empty(), &metrics).await;
        assert_eq!(got.to_string(), "the CiliumNode watch ended");
    }
}
