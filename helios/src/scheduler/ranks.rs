//! One scheduling decision, executed on every rank of a tensor-parallel core.
//!
//! [`RankGroup`] is an [`Executor`] over one executor per rank, each owned by
//! an execution thread of its own (a rank's device work never waits on
//! another's host thread). [`RankGroup::spawn`] builds each rank's executor on
//! its thread, so an executor that must stay on the thread that made it (a
//! loaded core's CUDA objects) can serve a rank. Every launch goes to every rank in the same order,
//! with the same page and slot assignments: the scheduler plans once. A
//! launch's completion is rank 0's records, once every rank finished it; the
//! ranks' graphs broadcast rank 0's sample before any state update, so a rank
//! that reports other records has diverged, and the group fails. A failure on
//! any rank fails the step on all of them (the scheduler then fails every
//! admitted request and stops, as for one device). Dropping the group, or
//! [`RankGroup::join`], ends every rank's thread and joins it: each rank
//! drains its launches ([`Executor::drain`]), then waits for every rank to
//! have drained (at most 30 s) before its executor, and its memory, goes: a
//! peer's launch may still read it.

use std::error::Error;
use std::fmt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::ExecutionError;
use super::executor::{Completion, Executor, Launch, Ticket};

/// A rank's failure, named with its rank.
#[derive(Debug)]
pub struct RankFailure {
    /// The rank that failed (the lowest, when several failed one step).
    pub rank: usize,
    /// What failed there.
    pub source: RankProblem,
    /// Every other rank that failed the same step, with what failed there, in
    /// rank order: a rank whose peer faulted fails too once its collective's
    /// wait runs out, so the lowest rank's failure need not be the cause.
    pub also: Vec<(usize, RankProblem)>,
}

/// What went wrong on one rank.
#[derive(Debug)]
pub enum RankProblem {
    /// Its executor reported an error.
    Execution(ExecutionError),
    /// Its execution thread ended (it panicked).
    ThreadEnded,
    /// It accepted a launch under another ticket than rank 0's.
    TicketDiverged {
        /// Rank 0's ticket.
        expected: u64,
        /// This rank's.
        found: u64,
    },
    /// Its completion records differ from rank 0's.
    RecordsDiverged,
    /// It failed an earlier step; the group takes no more launches (replies
    /// of that step may still sit unread in the ranks' channels).
    FailedBefore,
}

impl fmt::Display for RankFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt_at(self.rank, f)?;
        for (rank, problem) in &self.also {
            f.write_str("; also ")?;
            problem.fmt_at(*rank, f)?;
        }
        Ok(())
    }
}

impl RankProblem {
    /// What failed, named with the rank it failed on.
    fn fmt_at(&self, rank: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankProblem::Execution(err) => write!(f, "rank {rank}: {err}"),
            RankProblem::ThreadEnded => write!(f, "rank {rank}'s execution thread ended"),
            RankProblem::TicketDiverged { expected, found } => write!(
                f,
                "rank {rank} took the launch as ticket {found}, rank 0 as {expected}"
            ),
            RankProblem::RecordsDiverged => {
                write!(f, "rank {rank}'s completion records differ from rank 0's")
            }
            RankProblem::FailedBefore => write!(f, "rank {rank} failed an earlier step"),
        }
    }
}

impl Error for RankFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.source {
            RankProblem::Execution(err) => Some(err),
            _ => None,
        }
    }
}

/// A rank thread panicked and could not be joined cleanly.
#[derive(Debug, thiserror::Error)]
#[error("the execution thread of rank {rank} panicked")]
pub struct RankPanicked {
    /// The rank whose thread panicked.
    pub rank: usize,
}

enum Command {
    Submit(Box<Launch>),
    Poll(Ticket),
    Wait(Ticket),
}

enum Reply {
    Submitted(Result<Ticket, ExecutionError>),
    Polled(Result<Option<Completion>, ExecutionError>),
    Waited(Result<Completion, ExecutionError>),
}

struct RankThread {
    commands: Option<Sender<Command>>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<()>>,
}

/// An [`Executor`] over one executor per rank, each on its own thread.
pub struct RankGroup<E: Executor + 'static> {
    ranks: Vec<RankThread>,
    /// The ranks' executors live on their threads.
    _executors: std::marker::PhantomData<fn() -> E>,
    applies_masks: bool,
    /// The oldest launch's completions from the ranks that finished it.
    finished: Vec<Option<Completion>>,
    /// The rank whose failure ended the group's service.
    failed: Option<usize>,
}

impl<E: Executor + 'static> fmt::Debug for RankGroup<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RankGroup")
            .field("ranks", &self.ranks.len())
            .finish()
    }
}

fn serve<E: Executor>(executor: &mut E, commands: Receiver<Command>, replies: Sender<Reply>) {
    while let Ok(command) = commands.recv() {
        let reply = match command {
            Command::Submit(launch) => Reply::Submitted(executor.submit(&launch)),
            Command::Poll(ticket) => Reply::Polled(executor.poll(ticket)),
            Command::Wait(ticket) => Reply::Waited(executor.wait(ticket)),
        };
        if replies.send(reply).is_err() {
            break;
        }
    }
}

/// The longest collectives' wait limit a served group may load (`flare run
/// --collectives-timeout-ms`): a peer stuck in a collective traps within it,
/// before [`TEARDOWN_WAIT`] ends and a drained rank releases the memory that
/// collective polls. Without a limit (0) a stuck peer would poll it forever.
pub const COLLECTIVES_WAIT_LIMIT_MAX: Duration = Duration::from_secs(20);

/// How long a rank that has drained waits for its peers to drain before it
/// releases its memory anyway (a peer stuck past its collectives' wait
/// limit, or gone): longer than [`COLLECTIVES_WAIT_LIMIT_MAX`].
const TEARDOWN_WAIT: Duration = Duration::from_secs(30);
const _: () = assert!(TEARDOWN_WAIT.as_secs() > COLLECTIVES_WAIT_LIMIT_MAX.as_secs());

/// The ranks' meeting point before any releases its memory: each arrives once
/// it drained (or ended without an executor), then waits for every rank to
/// have arrived, at most [`TEARDOWN_WAIT`].
struct Teardown {
    arrived: Mutex<usize>,
    all: Condvar,
    ranks: usize,
}

impl Teardown {
    fn new(ranks: usize) -> Self {
        Self {
            arrived: Mutex::new(0),
            all: Condvar::new(),
            ranks,
        }
    }

    fn arrive(&self) {
        let mut arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        *arrived += 1;
        self.all.notify_all();
    }

    fn wait(&self) {
        let arrived = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .all
            .wait_timeout_while(arrived, TEARDOWN_WAIT, |arrived| *arrived < self.ranks);
    }
}

/// A rank thread's arrival at the [`Teardown`], made when dropped.
struct Arrival<'a>(&'a Teardown);

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.0.arrive();
    }
}

/// One rank's execution thread: builds its executor with `make`, reports
/// that to the spawner, serves the commands until they end, then drains,
/// meets the other ranks at `teardown` and only then drops the executor.
fn rank_thread<E, T, F>(
    rank: usize,
    make: &F,
    ready: &Sender<Result<(T, bool), ExecutionError>>,
    commands: Receiver<Command>,
    replies: Sender<Reply>,
    teardown: &Teardown,
) where
    E: Executor,
    F: Fn(usize) -> Result<(E, T), ExecutionError>,
{
    // Arrives at the teardown however this thread ends, a panic included, so
    // no peer waits for it in vain.
    let arrival = Arrival(teardown);
    let (mut executor, known) = match make(rank) {
        Ok(built) => built,
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    if ready.send(Ok((known, executor.applies_masks()))).is_ok() {
        serve(&mut executor, commands, replies);
    }
    // The rank's launches finish, then every rank's have, before its memory
    // goes (a peer's may read it).
    let _ = executor.drain();
    drop(arrival);
    teardown.wait();
    drop(executor);
}

/// Takes each rank's item (its reply) in rank order; the step's failure on
/// every rank whose item `take` refused.
fn each_rank<T>(
    items: impl IntoIterator<Item = T>,
    mut take: impl FnMut(usize, T) -> Result<(), RankProblem>,
) -> Result<(), ExecutionError> {
    let failures: Vec<_> = (items.into_iter().enumerate())
        .filter_map(|(rank, item)| take(rank, item).err().map(|problem| (rank, problem)))
        .collect();
    if failures.is_empty() {
        return Ok(());
    }
    Err(failed_together(failures))
}

fn failed(rank: usize, source: RankProblem) -> ExecutionError {
    failed_together(vec![(rank, source)])
}

/// The step's failure on every rank that failed it (at least one), named by
/// the lowest rank, the others listed.
fn failed_together(mut failures: Vec<(usize, RankProblem)>) -> ExecutionError {
    let (rank, source) = failures.remove(0);
    ExecutionError::Device {
        operation: "tensor-parallel step",
        source: Arc::new(RankFailure {
            rank,
            source,
            also: failures,
        }),
    }
}

impl<E: Executor + Send + 'static> RankGroup<E> {
    /// Starts one execution thread per rank; `executors[0]` is rank 0.
    pub fn new(executors: Vec<E>) -> Result<Self, ExecutionError> {
        assert!(!executors.is_empty(), "a rank group has at least rank 0");
        let world_size = executors.len();
        let executors = Mutex::new(executors.into_iter().map(Some).collect::<Vec<_>>());
        let (group, _) = Self::spawn(world_size, move |rank| {
            let mut executors = executors
                .lock()
                .expect("no rank panics while taking its own");
            Ok((executors[rank].take().expect("each rank takes its own"), ()))
        })?;
        Ok(group)
    }
}

impl<E: Executor + 'static> RankGroup<E> {
    /// Starts one execution thread per rank and builds rank `r`'s executor
    /// there with `make(r)`, which also returns what the caller needs to know
    /// of the rank (a loaded core's load report), given back in rank order
    /// once every rank is built. The ranks build at the same time. If any
    /// fails, the ranks already built are ended and joined, and the failure
    /// names every rank that failed to build.
    pub fn spawn<T, F>(world_size: usize, make: F) -> Result<(Self, Vec<T>), ExecutionError>
    where
        T: Send + 'static,
        F: Fn(usize) -> Result<(E, T), ExecutionError> + Send + Sync + 'static,
    {
        assert!(world_size > 0, "a rank group has at least rank 0");
        let make = Arc::new(make);
        let teardown = Arc::new(Teardown::new(world_size));
        let mut ranks = Vec::with_capacity(world_size);
        let mut built = Vec::with_capacity(world_size);
        let group = |ranks| Self {
            ranks,
            _executors: std::marker::PhantomData,
            applies_masks: false,
            finished: vec![None; world_size],
            failed: None,
        };
        for rank in 0..world_size {
            let (command_tx, command_rx) = channel();
            let (reply_tx, reply_rx) = channel();
            let (ready_tx, ready_rx) = channel();
            let make = Arc::clone(&make);
            let meeting = Arc::clone(&teardown);
            let spawned = std::thread::Builder::new()
                .name(format!("helios-rank-{rank}"))
                .spawn(move || {
                    rank_thread(rank, &*make, &ready_tx, command_rx, reply_tx, &meeting)
                });
            let handle = match spawned {
                Ok(handle) => handle,
                Err(err) => {
                    // The threads started so far end with the partial group; the
                    // ranks never started count as arrived at the teardown.
                    for _ in rank..world_size {
                        teardown.arrive();
                    }
                    drop(group(ranks));
                    return Err(ExecutionError::Device {
                        operation: "rank threads",
                        source: Arc::new(err),
                    });
                }
            };
            ranks.push(RankThread {
                commands: Some(command_tx),
                replies: reply_rx,
                handle: Some(handle),
            });
            built.push(ready_rx);
        }
        let mut known = Vec::with_capacity(world_size);
        let mut applies_masks = true;
        let readiness = (built.iter()).map(Receiver::recv);
        let ready = each_rank(readiness, |_, ready| match ready {
            Ok(Ok((value, masks))) => {
                known.push(value);
                applies_masks &= masks;
                Ok(())
            }
            Ok(Err(err)) => Err(RankProblem::Execution(err)),
            Err(_) => Err(RankProblem::ThreadEnded),
        });
        let mut group = group(ranks);
        // On a failure, dropping the group ends and joins every rank's thread.
        ready?;
        group.applies_masks = applies_masks;
        Ok((group, known))
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }

    /// Ends every rank's thread and joins it.
    pub fn join(mut self) -> Result<(), RankPanicked> {
        let mut panicked = None;
        // Every rank's commands end first: each waits for the others to drain.
        for thread in &mut self.ranks {
            thread.commands = None;
        }
        for (rank, thread) in self.ranks.iter_mut().enumerate() {
            let handle = thread.handle.take().expect("joined once");
            if handle.join().is_err() {
                panicked = panicked.or(Some(RankPanicked { rank }));
            }
        }
        panicked.map_or(Ok(()), Err)
    }

    /// Sends `command` to every rank whose `pending` is set, then collects
    /// each one's reply.
    fn broadcast(
        &mut self,
        mut command: impl FnMut() -> Command,
        pending: &[bool],
    ) -> Result<Vec<Option<Reply>>, ExecutionError> {
        for (rank, thread) in self.ranks.iter().enumerate() {
            if !pending[rank] {
                continue;
            }
            let sent = (thread.commands.as_ref()).is_some_and(|tx| tx.send(command()).is_ok());
            if !sent {
                return Err(failed(rank, RankProblem::ThreadEnded));
            }
        }
        let mut replies = Vec::with_capacity(self.ranks.len());
        for (rank, thread) in self.ranks.iter().enumerate() {
            if !pending[rank] {
                replies.push(None);
                continue;
            }
            let reply =
                (thread.replies.recv()).map_err(|_| failed(rank, RankProblem::ThreadEnded))?;
            replies.push(Some(reply));
        }
        Ok(replies)
    }

    /// Rank 0's completion once every rank finished; `None` before.
    fn gather(&mut self) -> Result<Option<Completion>, ExecutionError> {
        if self.finished.iter().any(Option::is_none) {
            return Ok(None);
        }
        let mut completions = self
            .finished
            .iter_mut()
            .map(|c| c.take().expect("finished"));
        let zero = completions.next().expect("rank 0");
        for (offset, completion) in completions.enumerate() {
            if completion != zero {
                return Err(failed(offset + 1, RankProblem::RecordsDiverged));
            }
        }
        Ok(Some(zero))
    }

    fn pending(&self) -> Vec<bool> {
        self.finished.iter().map(Option::is_none).collect()
    }
}

impl<E: Executor + 'static> Executor for RankGroup<E> {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        self.guarded(|group| group.submit_once(launch))
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        self.guarded(|group| group.poll_once(ticket))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        self.guarded(|group| group.wait_once(ticket))
    }

    fn applies_masks(&self) -> bool {
        self.applies_masks
    }
}

impl<E: Executor + 'static> RankGroup<E> {
    /// Runs `step` unless a rank failed before; a failure ends the group's
    /// service (the scheduler stops after it too).
    fn guarded<T>(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<T, ExecutionError>,
    ) -> Result<T, ExecutionError> {
        if let Some(rank) = self.failed {
            return Err(failed(rank, RankProblem::FailedBefore));
        }
        let result = step(self);
        if let Err(ExecutionError::Device { source, .. }) = &result {
            let rank = source.downcast_ref::<RankFailure>().map_or(0, |f| f.rank);
            self.failed = Some(rank);
        }
        result
    }

    fn submit_once(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        let all = vec![true; self.ranks.len()];
        let replies = self.broadcast(|| Command::Submit(Box::new(launch.clone())), &all)?;
        let mut tickets = Vec::with_capacity(replies.len());
        each_rank(replies, |_, reply| match reply {
            Some(Reply::Submitted(Ok(ticket))) => {
                tickets.push(ticket);
                Ok(())
            }
            Some(Reply::Submitted(Err(err))) => Err(RankProblem::Execution(err)),
            _ => Err(RankProblem::ThreadEnded),
        })?;
        let zero = tickets[0];
        if let Some((rank, ticket)) = (tickets.iter().enumerate()).find(|(_, t)| **t != zero) {
            return Err(failed(
                rank,
                RankProblem::TicketDiverged {
                    expected: zero.0,
                    found: ticket.0,
                },
            ));
        }
        Ok(zero)
    }

    fn poll_once(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        let pending = self.pending();
        let replies = self.broadcast(|| Command::Poll(ticket), &pending)?;
        let finished = &mut self.finished;
        each_rank(replies, |rank, reply| match reply {
            None => Ok(()),
            Some(Reply::Polled(Ok(done))) => {
                finished[rank] = done;
                Ok(())
            }
            Some(Reply::Polled(Err(err))) => Err(RankProblem::Execution(err)),
            Some(_) => Err(RankProblem::ThreadEnded),
        })?;
        self.gather()
    }

    fn wait_once(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        let pending = self.pending();
        let replies = self.broadcast(|| Command::Wait(ticket), &pending)?;
        let finished = &mut self.finished;
        each_rank(replies, |rank, reply| match reply {
            None => Ok(()),
            Some(Reply::Waited(Ok(done))) => {
                finished[rank] = Some(done);
                Ok(())
            }
            Some(Reply::Waited(Err(err))) => Err(RankProblem::Execution(err)),
            Some(_) => Err(RankProblem::ThreadEnded),
        })?;
        Ok(self.gather()?.expect("every rank finished the launch"))
    }
}

impl<E: Executor + 'static> Drop for RankGroup<E> {
    /// Closes every rank's commands and joins its thread. A rank blocked in a
    /// launch whose peer never joins its collective holds the join until the
    /// collective's bounded wait traps (the limit Helios loads) or the device
    /// layer fails otherwise.
    fn drop(&mut self) {
        for thread in &mut self.ranks {
            thread.commands = None;
        }
        for thread in &mut self.ranks {
            if let Some(handle) = thread.handle.take() {
                // A panicked rank was reported by the step that saw it end.
                let _ = handle.join();
            }
        }
    }
}
