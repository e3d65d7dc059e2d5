//! The model thread: one thread owns the [`Scheduler`] and its executor;
//! everything else talks to it by message through a [`SchedulerHandle`].
//!
//! The thread sleeps on its inbox while the scheduler is idle (after polling
//! it for [`SchedulerConfig::idle_spin`]: a request arriving then skips the
//! thread's wake-up) and otherwise alternates between taking every queued
//! message and running one iteration. Rules:
//! - each request's events go to its own non-blocking channel, which async
//!   tasks await ([`RequestStream::next`]) and plain threads block on
//!   ([`RequestStream::next_event`]): no OS thread is held per request;
//! - the model thread never blocks on a consumer: a request's channel holds
//!   at most its output limit of tokens plus its admission and terminal
//!   events;
//! - dropping a [`RequestStream`] before its terminal event is the one way
//!   a consumer cancels (the cancellation applies at the next submission
//!   boundary); a submission whose caller left before its id arrived is
//!   cancelled by the model thread itself, and one whose caller left after
//!   it arrived by the dropped [`Submission`];
//! - health and counters are published by the model thread into a shared
//!   [`Status`] (at most [`PUBLISH_INTERVAL`] old while it runs, current
//!   whenever it goes idle, and before any admission or terminal event is
//!   delivered), so
//!   `/health` and `/metrics` read it without a round trip.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc as async_mpsc, oneshot};

use super::engine::{Scheduler, SchedulerConfig};
use super::error::{AdmissionError, ExecutionError, SchedulerError};
use super::events::{Event, Metrics, RequestEvent};
use super::executor::Executor;
use super::geometry::Geometry;
use super::ids::RequestId;
use super::latency::{Latency, LatencyTracker};
use super::request::RequestSpec;
use crate::prefix::PrefixChain;

/// How a shutdown treats requests that have not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Stop admitting new requests and run the others to completion.
    Finish,
    /// Stop admitting and cancel every request; launches in flight drain.
    Cancel,
}

/// Whether the model thread can take requests.
#[derive(Debug, Clone)]
pub enum Health {
    /// Serving.
    Ready,
    /// Shutting down: no new requests.
    Stopping,
    /// The executor failed; every request failed with this error.
    Failed(ExecutionError),
}

/// Health, counters and latency histograms, as `/health` and `/metrics`
/// report them.
#[derive(Debug, Clone)]
pub struct Status {
    /// Whether the model thread can take requests.
    pub health: Health,
    /// Scheduler counters.
    pub metrics: Metrics,
    /// Time to first token and inter-token latency, as the model thread
    /// hands tokens to the requests' streams.
    pub latency: Latency,
}

/// How stale the published [`Status`] may be while the model thread runs.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(5);

type SubmitReply = oneshot::Sender<Result<RequestId, AdmissionError>>;

enum Message {
    Submit {
        spec: RequestSpec,
        /// The prompt's prefix chain, hashed by the submitting thread.
        chain: Option<PrefixChain>,
        events: async_mpsc::UnboundedSender<Event>,
        reply: SubmitReply,
    },
    Cancel(RequestId),
    Shutdown(ShutdownMode),
}

/// What the model thread publishes for readers of its status.
#[derive(Debug)]
struct Published {
    status: Status,
    /// The model thread has returned (or panicked): nothing serves.
    gone: bool,
}

type SharedStatus = Arc<Mutex<Published>>;

fn lock(shared: &SharedStatus) -> std::sync::MutexGuard<'_, Published> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A cloneable way to talk to the model thread.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    inbox: Sender<Message>,
    /// The prefix cache's root salt, when it is enabled: a submission
    /// hashes its prompt's chain on its own thread, not the model thread's.
    prefix_salt: Option<Arc<[u8]>>,
    status: SharedStatus,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Submit { .. } => "Submit",
            Self::Cancel(_) => "Cancel",
            Self::Shutdown(_) => "Shutdown",
        })
    }
}

/// A submission sent to the model thread, its id not yet taken.
///
/// Sending and awaiting are apart so that the thread that prepared a
/// request sends it (the model thread starts on it at once) while the
/// caller is still being woken to await the answer. Dropping it cancels
/// the request, whether or not the model thread answered already.
#[derive(Debug)]
pub struct Submission {
    /// `None` once taken (or closed by the drop).
    answer: Option<oneshot::Receiver<Result<RequestId, AdmissionError>>>,
    events: Option<async_mpsc::UnboundedReceiver<Event>>,
    handle: SchedulerHandle,
}

impl Submission {
    /// Awaits the model thread's answer: the request's stream, whose events
    /// start with [`Event::Admitted`], or why it was refused. Dropping the
    /// future before it resolves cancels the request.
    pub async fn accepted(mut self) -> Result<RequestStream, AdmissionError> {
        let answer = self.answer.as_mut().expect("an unanswered submission");
        let id = answer.await.map_err(|_| AdmissionError::Unavailable)??;
        Ok(self.stream(id))
    }

    /// [`Self::accepted`] for a thread outside the async runtime: blocks.
    pub fn accepted_blocking(mut self) -> Result<RequestStream, AdmissionError> {
        let answer = self.answer.take().expect("an unanswered submission");
        let id = answer
            .blocking_recv()
            .map_err(|_| AdmissionError::Unavailable)??;
        Ok(self.stream(id))
    }

    fn stream(&mut self, id: RequestId) -> RequestStream {
        self.answer = None;
        RequestStream {
            id,
            events: self.events.take().expect("a submission's events"),
            handle: self.handle.clone(),
            finished: false,
        }
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        // Closed first, then read: an answer sent before the close is seen
        // here and its request cancelled; one sent after it fails to send,
        // and the model thread cancels the request itself.
        answer.close();
        if let Ok(Ok(id)) = answer.try_recv() {
            self.handle.cancel(id);
        }
    }
}

impl SchedulerHandle {
    /// The prefix chain of `prompt` under the cache's salt, when the cache
    /// is on: hashing a long prompt takes a while, so callers compute it
    /// where CPU work belongs (HTTP: the preparation pool), not on the model
    /// thread or an async worker.
    pub fn chain(&self, prompt: &[u32]) -> Option<PrefixChain> {
        (self.prefix_salt.as_deref()).map(|salt| PrefixChain::new(salt, prompt))
    }

    /// Submits a request whose prompt's chain [`Self::chain`] computed; on
    /// success its events arrive on the stream, starting with
    /// [`Event::Admitted`]. Dropping the future before it resolves cancels
    /// the request.
    pub async fn submit(
        &self,
        spec: RequestSpec,
        chain: Option<PrefixChain>,
    ) -> Result<RequestStream, AdmissionError> {
        self.send(spec, chain)?.accepted().await
    }

    /// Submits a request from a thread outside the async runtime (hashing
    /// its chain there): blocks until the model thread answers.
    pub fn submit_blocking(&self, spec: RequestSpec) -> Result<RequestStream, AdmissionError> {
        let chain = self.chain(&spec.prompt);
        self.send(spec, chain)?.accepted_blocking()
    }

    /// Sends a request to the model thread without waiting for its answer
    /// ([`Submission::accepted`] awaits it); fails only when the model
    /// thread is gone.
    pub fn send(
        &self,
        spec: RequestSpec,
        chain: Option<PrefixChain>,
    ) -> Result<Submission, AdmissionError> {
        let (events, receiver) = async_mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let message = Message::Submit {
            spec,
            chain,
            events,
            reply,
        };
        self.inbox
            .send(message)
            .map_err(|_| AdmissionError::Unavailable)?;
        Ok(Submission {
            answer: Some(answer),
            events: Some(receiver),
            handle: self.clone(),
        })
    }

    /// Cancels a request at the next submission boundary.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.inbox.send(Message::Cancel(id));
    }

    /// Stops admission (new submissions fail with
    /// [`AdmissionError::ShuttingDown`]) and finishes or cancels the
    /// requests already submitted; [`Worker::shutdown`] then joins.
    pub fn begin_shutdown(&self, mode: ShutdownMode) {
        let _ = self.inbox.send(Message::Shutdown(mode));
    }

    /// Health and counters as the model thread last published them (see
    /// [`PUBLISH_INTERVAL`]); never waits for the model thread.
    pub fn status(&self) -> Result<Status, SchedulerError> {
        let published = lock(&self.status);
        if published.gone {
            return Err(SchedulerError::WorkerGone);
        }
        Ok(published.status.clone())
    }
}

/// The events of one submitted request. Dropping it before the terminal
/// event cancels the request.
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    events: async_mpsc::UnboundedReceiver<Event>,
    handle: SchedulerHandle,
    finished: bool,
}

impl RequestStream {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, awaiting it; `Ok(None)` after the terminal event. A
    /// channel that closes before the terminal event is
    /// [`SchedulerError::WorkerGone`].
    pub async fn next(&mut self) -> Result<Option<Event>, SchedulerError> {
        if self.finished {
            return Ok(None);
        }
        let event = self.events.recv().await;
        self.take(event)
    }

    /// [`Self::next`] for a thread outside the async runtime: blocks.
    pub fn next_event(&mut self) -> Result<Option<Event>, SchedulerError> {
        if self.finished {
            return Ok(None);
        }
        let event = self.events.blocking_recv();
        self.take(event)
    }

    fn take(&mut self, event: Option<Event>) -> Result<Option<Event>, SchedulerError> {
        let event = event.ok_or(SchedulerError::WorkerGone)?;
        self.finished = event.is_terminal();
        Ok(Some(event))
    }

    /// Cancels the request; its terminal event still arrives.
    pub fn cancel(&self) {
        self.handle.cancel(self.id);
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            self.handle.cancel(self.id);
        }
    }
}

/// The running model thread. Dropping it cancels everything and joins.
#[derive(Debug)]
pub struct Worker {
    handle: SchedulerHandle,
    thread: Option<JoinHandle<Result<(), SchedulerError>>>,
}

impl Worker {
    /// Starts the model thread: `make_executor` runs on it (the executor
    /// never leaves it), then the scheduler is built. Returns once the
    /// thread is ready, or with the startup failure.
    pub fn spawn<E, F>(
        geometry: Geometry,
        config: SchedulerConfig,
        make_executor: F,
    ) -> Result<Self, SchedulerError>
    where
        E: Executor + 'static,
        F: FnOnce() -> Result<E, ExecutionError> + Send + 'static,
    {
        Self::spawn_with(config, move || make_executor().map(|e| (e, geometry)))
    }

    /// Like [`Worker::spawn`], for an executor whose geometry is known only
    /// once it exists (a loaded core backs as many KV pages as fit): `make`
    /// returns both.
    pub fn spawn_with<E, F>(config: SchedulerConfig, make: F) -> Result<Self, SchedulerError>
    where
        E: Executor + 'static,
        F: FnOnce() -> Result<(E, Geometry), ExecutionError> + Send + 'static,
    {
        let (inbox, messages) = mpsc::channel();
        let (ready, started) = mpsc::sync_channel(1);
        let prefix_salt = (config.prefix.as_ref())
            .filter(|prefix| prefix.snapshot_rows > 0)
            .map(|prefix| Arc::from(prefix.salt.as_slice()));
        let status = Arc::new(Mutex::new(Published {
            status: Status {
                health: Health::Ready,
                metrics: Metrics::default(),
                latency: Latency::default(),
            },
            gone: false,
        }));
        let published = Arc::clone(&status);
        let thread = thread::Builder::new()
            .name("helios-model".to_owned())
            .spawn(move || {
                // Marks the status gone however the thread ends, a panic
                // included.
                let _gone = GoneOnExit(Arc::clone(&published));
                let scheduler = make()
                    .map_err(SchedulerError::Execution)
                    .and_then(|(executor, geometry)| Scheduler::new(geometry, config, executor));
                match scheduler {
                    Ok(scheduler) => {
                        let mut model = ModelThread::new(scheduler, messages, published);
                        model.publish();
                        let _ = ready.send(Ok(()));
                        model.run()
                    }
                    Err(error) => {
                        let _ = ready.send(Err(error));
                        Ok(())
                    }
                }
            })
            .map_err(|error| SchedulerError::Spawn(Arc::new(error)))?;
        let startup = started.recv().unwrap_or(Err(SchedulerError::WorkerGone));
        let worker = Self {
            handle: SchedulerHandle {
                inbox,
                prefix_salt,
                status,
            },
            thread: Some(thread),
        };
        match startup {
            Ok(()) => Ok(worker),
            Err(error) => {
                drop(worker);
                Err(error)
            }
        }
    }

    /// A handle for submitting, cancelling and reading status.
    pub fn handle(&self) -> SchedulerHandle {
        self.handle.clone()
    }

    /// Stops admission, finishes or cancels every request, drains launches
    /// in flight and joins the thread. Returns the executor failure, if the
    /// worker had one.
    pub fn shutdown(mut self, mode: ShutdownMode) -> Result<(), SchedulerError> {
        self.stop(mode)
    }

    fn stop(&mut self, mode: ShutdownMode) -> Result<(), SchedulerError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let _ = self.handle.inbox.send(Message::Shutdown(mode));
        thread.join().map_err(|_| SchedulerError::WorkerGone)?
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop(ShutdownMode::Cancel);
    }
}

/// Sets the published status gone when the model thread ends.
struct GoneOnExit(SharedStatus);

impl Drop for GoneOnExit {
    fn drop(&mut self) {
        lock(&self.0).gone = true;
    }
}

/// The next message of `inbox`: polled for up to `spin` (yielding the core
/// between polls), then waited for asleep. A message sent within `spin` is
/// taken without the sleeping thread's wake-up: on a 16-core GPU host, with
/// the client pausing 20 ms before each request, the fake server's time to
/// first token was 0.94 to 0.96x that of parking at once (50 ms of polling,
/// measured without yielding; on 2 cores it lost: `bench/results/issue23/
/// 2026-12-07g-h100-host-spin`, and `crate::serve::idle_spin_for`).
fn receive_after_polling<T>(inbox: &Receiver<T>, spin: Duration) -> Result<T, mpsc::RecvError> {
    if !spin.is_zero() {
        let deadline = Instant::now() + spin;
        while Instant::now() < deadline {
            match inbox.try_recv() {
                Ok(message) => return Ok(message),
                Err(mpsc::TryRecvError::Empty) => thread::yield_now(),
                Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            }
        }
    }
    inbox.recv()
}

/// The loop of the model thread.
struct ModelThread<E> {
    scheduler: Scheduler<E>,
    inbox: Receiver<Message>,
    streams: BTreeMap<RequestId, async_mpsc::UnboundedSender<Event>>,
    stopping: bool,
    latency: LatencyTracker,
    published: SharedStatus,
    published_at: Instant,
}

impl<E: Executor> ModelThread<E> {
    fn new(scheduler: Scheduler<E>, inbox: Receiver<Message>, published: SharedStatus) -> Self {
        Self {
            scheduler,
            inbox,
            streams: BTreeMap::new(),
            stopping: false,
            latency: LatencyTracker::default(),
            published,
            published_at: Instant::now(),
        }
    }

    fn run(mut self) -> Result<(), SchedulerError> {
        loop {
            if self.scheduler.is_idle() {
                self.publish();
                if self.stopping {
                    break;
                }
                match receive_after_polling(&self.inbox, self.scheduler.config.idle_spin) {
                    Ok(message) => self.handle(message),
                    Err(_) => self.stop(ShutdownMode::Cancel),
                }
            }
            loop {
                match self.inbox.try_recv() {
                    Ok(message) => self.handle(message),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.stop(ShutdownMode::Cancel);
                        break;
                    }
                }
            }
            if !self.scheduler.is_idle() {
                // A failure already failed every request; the scheduler is
                // idle from now on and keeps the failure for `status`.
                let _ = self.scheduler.step();
            }
            self.route_events();
        }
        match self.scheduler.failure() {
            Some(error) => Err(SchedulerError::Execution(error.clone())),
            None => Ok(()),
        }
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Submit {
                spec,
                chain,
                events,
                reply,
            } => {
                let result = if self.stopping {
                    Err(AdmissionError::ShuttingDown)
                } else {
                    self.scheduler.submit_chained(spec, chain)
                };
                if let Ok(id) = result {
                    self.latency.submitted(id, Instant::now());
                    self.streams.insert(id, events);
                    // The caller left before its id arrived: nobody can
                    // drop a stream for it, so cancel here.
                    if reply.send(Ok(id)).is_err() {
                        self.scheduler.cancel(id);
                    }
                } else {
                    let _ = reply.send(result);
                }
            }
            Message::Cancel(id) => self.scheduler.cancel(id),
            Message::Shutdown(mode) => {
                self.stop(mode);
                self.publish();
            }
        }
    }

    /// Publishes the current status for `SchedulerHandle::status`.
    fn publish(&mut self) {
        let status = self.status();
        lock(&self.published).status = status;
        self.published_at = Instant::now();
    }

    fn status(&self) -> Status {
        let health = match self.scheduler.failure() {
            Some(error) => Health::Failed(error.clone()),
            None if self.stopping => Health::Stopping,
            None => Health::Ready,
        };
        let mut latency = self.latency.latency().clone();
        latency.grammar_mask = self.scheduler.mask_time().clone();
        latency.first_token = self.scheduler.first_token().clone();
        Status {
            health,
            metrics: self.scheduler.metrics(),
            latency,
        }
    }

    fn stop(&mut self, mode: ShutdownMode) {
        self.stopping = true;
        if mode == ShutdownMode::Cancel {
            for &id in self.streams.keys() {
                self.scheduler.cancel(id);
            }
        }
    }

    /// Sends each event to its request's channel, after publishing the
    /// status when one of them admits or ends a request (so a consumer that
    /// saw its admission or terminal event reads gauges that include it). A closed channel
    /// needs nothing: its stream's drop sent the cancellation.
    fn route_events(&mut self) {
        let now = Instant::now();
        let events = self.scheduler.drain_events();
        for event in &events {
            self.latency.routed(event, now);
        }
        let changes_gauges = |event: &RequestEvent| {
            event.event.is_terminal() || matches!(event.event, Event::Admitted { .. })
        };
        if events.iter().any(changes_gauges)
            || now.duration_since(self.published_at) >= PUBLISH_INTERVAL
        {
            self.publish();
        }
        for event in events {
            let terminal = event.event.is_terminal();
            if let Some(channel) = self.streams.get(&event.request) {
                let _ = channel.send(event.event);
            }
            if terminal {
                self.streams.remove(&event.request);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle over a bare inbox: the test plays the model thread.
    fn handle() -> (SchedulerHandle, Receiver<Message>) {
        let (inbox, messages) = mpsc::channel();
        let status = Arc::new(Mutex::new(Published {
            status: Status {
                health: Health::Ready,
                metrics: Metrics::default(),
                latency: Latency::default(),
            },
            gone: false,
        }));
        let handle = SchedulerHandle {
            inbox,
            prefix_salt: None,
            status,
        };
        (handle, messages)
    }

    fn spec() -> RequestSpec {
        RequestSpec {
            prompt: vec![1, 2, 3],
            max_new_tokens: 4,
            sampling: Default::default(),
            seed: 0,
            message_endpoints: Vec::new(),
            grammar: None,
        }
    }

    /// A submission sent over a bare inbox, and the inbox.
    fn sent() -> (Submission, Receiver<Message>) {
        let (handle, messages) = handle();
        (handle.send(spec(), None).unwrap(), messages)
    }

    fn reply_of(message: Message) -> SubmitReply {
        match message {
            Message::Submit { reply, .. } => reply,
            other => panic!("expected a submission, got {other:?}"),
        }
    }

    /// Plays the model thread's answer to the submission waiting in `messages`.
    fn answer(messages: &Receiver<Message>, answer: Result<RequestId, AdmissionError>) {
        reply_of(messages.try_recv().unwrap()).send(answer).unwrap();
    }

    /// Whether the next message is the cancellation of `id`.
    fn cancels(messages: &Receiver<Message>, id: RequestId) -> bool {
        matches!(messages.try_recv(), Ok(Message::Cancel(cancelled)) if cancelled == id)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn dropping_an_answered_submission_cancels_its_request() {
        let (submission, messages) = sent();
        answer(&messages, Ok(RequestId(7)));
        // Its caller left after the answer arrived: nobody will take the
        // stream, so the drop itself cancels the request.
        drop(submission);
        assert!(cancels(&messages, RequestId(7)));
    }

    #[test]
    fn an_unanswered_submission_refuses_the_answer_once_dropped() {
        let (submission, messages) = sent();
        drop(submission);
        // The model thread's answer fails to send, which is how it knows to
        // cancel the request itself; the drop sent nothing.
        let reply = reply_of(messages.try_recv().unwrap());
        assert!(reply.send(Ok(RequestId(3))).is_err());
        assert!(messages.try_recv().is_err());
    }

    #[test]
    fn an_accepted_submission_hands_its_stream_over_without_cancelling() {
        let (submission, messages) = sent();
        answer(&messages, Ok(RequestId(9)));
        let stream = submission.accepted_blocking().unwrap();
        assert_eq!(stream.id(), RequestId(9));
        assert!(messages.try_recv().is_err());
        // Dropping the stream before its terminal event is the cancellation.
        drop(stream);
        assert!(cancels(&messages, RequestId(9)));
    }

    #[test]
    fn dropping_the_wait_for_an_answer_that_arrived_cancels_its_request() {
        let runtime = runtime();
        let (submission, messages) = sent();
        let mut accepted = Box::pin(submission.accepted());
        runtime.block_on(async {
            // Polled once, before the answer: it waits.
            tokio::select! {
                biased;
                _ = &mut accepted => panic!("accepted before any answer"),
                () = async {} => {}
            }
        });
        answer(&messages, Ok(RequestId(5)));
        // The HTTP task's future is dropped (its client left) with the
        // answer unread.
        drop(accepted);
        assert!(cancels(&messages, RequestId(5)));
    }

    #[test]
    fn an_awaited_answer_hands_the_stream_over_without_cancelling() {
        let (submission, messages) = sent();
        answer(&messages, Ok(RequestId(4)));
        let stream = runtime().block_on(submission.accepted()).unwrap();
        assert_eq!(stream.id(), RequestId(4));
        assert!(messages.try_recv().is_err());
    }

    #[test]
    fn a_refused_submission_cancels_nothing() {
        let (submission, messages) = sent();
        answer(&messages, Err(AdmissionError::Unavailable));
        assert!(matches!(
            submission.accepted_blocking(),
            Err(AdmissionError::Unavailable)
        ));
        assert!(messages.try_recv().is_err());
    }

    /// Sends `value` on `sender` after `delay`, from another thread.
    fn send_later<T: Send + 'static>(sender: Sender<T>, value: T, delay: Duration) {
        thread::spawn(move || {
            thread::sleep(delay);
            let _ = sender.send(value);
        });
    }

    #[test]
    fn a_message_sent_while_polling_is_taken_without_waiting_out_the_poll() {
        let (sender, inbox) = mpsc::channel();
        let started = Instant::now();
        send_later(sender, 7_u32, Duration::from_millis(5));
        assert_eq!(
            receive_after_polling(&inbox, Duration::from_secs(30)),
            Ok(7)
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_message_sent_after_the_poll_wakes_the_sleeping_receiver() {
        let (sender, inbox) = mpsc::channel();
        let started = Instant::now();
        send_later(sender, 8_u32, Duration::from_millis(60));
        assert_eq!(
            receive_after_polling(&inbox, Duration::from_millis(5)),
            Ok(8)
        );
        assert!(started.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn a_sender_gone_while_polling_or_asleep_ends_the_wait() {
        for spin in [Duration::from_secs(30), Duration::ZERO] {
            let (sender, inbox) = mpsc::channel::<u32>();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(5));
                drop(sender);
            });
            let started = Instant::now();
            assert_eq!(receive_after_polling(&inbox, spin), Err(mpsc::RecvError));
            assert!(started.elapsed() < Duration::from_secs(10));
        }
    }

    #[test]
    fn without_a_poll_the_receiver_sleeps_until_the_message() {
        let (sender, inbox) = mpsc::channel();
        send_later(sender, 9_u32, Duration::from_millis(5));
        assert_eq!(receive_after_polling(&inbox, Duration::ZERO), Ok(9));
    }
}
