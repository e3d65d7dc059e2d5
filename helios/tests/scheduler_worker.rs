//! The model thread and its handle: submission, event streams,
//! cancellation by dropping a stream, health, and shutdown.

mod scheduler_support;

use std::thread;
use std::time::{Duration, Instant};

use helios::scheduler::test_executor::{RequestLog, Transcript};
use helios::scheduler::{
    AdmissionError, Event, ExecutionError, FinishReason, Health, RequestEvent, RequestStream,
    SchedulerConfig, SchedulerError, ShutdownMode, Worker,
};
use scheduler_support::{reference, spec, Setup};

fn spawn(setup: &Setup, delay: u32) -> Worker {
    let executor_setup = setup.clone();
    Worker::spawn(setup.geometry(), setup.config.clone(), move || {
        let mut executor = executor_setup.executor();
        executor.set_completion_delay(delay);
        Ok(executor)
    })
    .unwrap()
}

/// Reads a stream to its terminal event.
fn drain(mut stream: RequestStream) -> RequestLog {
    let id = stream.id();
    let mut transcript = Transcript::default();
    while let Some(event) = stream.next_event().unwrap() {
        transcript.record(vec![RequestEvent { request: id, event }]);
    }
    transcript.get(id)
}

#[test]
fn requests_from_many_threads_stream_their_reference_outputs() {
    let setup = Setup {
        kv_pages: 20,
        stop_every: Some(30),
        ..Setup::default()
    };
    let worker = spawn(&setup, 1);
    let clients: Vec<_> = (0..12)
        .map(|seed| {
            let handle = worker.handle();
            let setup = setup.clone();
            thread::spawn(move || {
                let request = spec(10 + seed as usize * 7, 40, seed);
                let stream = handle.submit_blocking(request.clone()).unwrap();
                let log = drain(stream);
                let expected = reference(&setup, &request);
                assert_eq!(log.tokens, expected.tokens);
                assert_eq!(log.finish, Some(expected.reason));
                assert_eq!((log.admitted, log.protocol_errors), (1, 0));
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let status = worker.handle().status().unwrap();
    assert!(matches!(status.health, Health::Ready));
    assert_eq!(status.metrics.running, 0);
    worker.shutdown(ShutdownMode::Finish).unwrap();
}

#[test]
fn dropping_a_stream_cancels_its_request() {
    let setup = Setup {
        decode_capacities: vec![1],
        ..Setup::default()
    };
    let worker = spawn(&setup, 0);
    let handle = worker.handle();
    let mut stream = handle.submit_blocking(spec(5, 900, 0)).unwrap();
    assert!(matches!(
        stream.next_event().unwrap(),
        Some(Event::Admitted { cached_tokens: 0 })
    ));
    assert!(matches!(
        stream.next_event().unwrap(),
        Some(Event::Tokens { .. })
    ));
    drop(stream);
    // The only slot comes back: a second request runs to completion.
    let request = spec(5, 5, 1);
    let log = drain(handle.submit_blocking(request.clone()).unwrap());
    assert_eq!(log.tokens, reference(&setup, &request).tokens);
    let status = handle.status().unwrap();
    assert_eq!((status.metrics.running, status.metrics.pages_used), (0, 0));
    worker.shutdown(ShutdownMode::Finish).unwrap();
}

#[test]
fn a_cancelled_stream_still_receives_its_terminal_event() {
    let setup = Setup::default();
    let worker = spawn(&setup, 0);
    let mut stream = worker.handle().submit_blocking(spec(5, 900, 0)).unwrap();
    assert!(matches!(
        stream.next_event().unwrap(),
        Some(Event::Admitted { cached_tokens: 0 })
    ));
    stream.cancel();
    let log = drain(stream);
    assert_eq!(log.finish, Some(FinishReason::Cancelled));
    worker.shutdown(ShutdownMode::Finish).unwrap();
}

#[test]
fn shutdown_stops_admission_and_cancels_or_finishes_requests() {
    for mode in [ShutdownMode::Cancel, ShutdownMode::Finish] {
        let setup = Setup::default();
        let worker = spawn(&setup, 2);
        let handle = worker.handle();
        let streams: Vec<_> = (0..6)
            .map(|seed| handle.submit_blocking(spec(20, 300, seed)).unwrap())
            .collect();
        worker.shutdown(mode).unwrap();
        for stream in streams {
            let log = drain(stream);
            assert_eq!((log.terminal_events, log.protocol_errors), (1, 0));
            let expected = match mode {
                ShutdownMode::Cancel => FinishReason::Cancelled,
                ShutdownMode::Finish => FinishReason::Length,
            };
            assert_eq!(log.finish, Some(expected));
        }
        assert_eq!(
            handle.submit_blocking(spec(5, 5, 9)).unwrap_err(),
            AdmissionError::Unavailable
        );
    }
}

#[test]
fn a_full_queue_is_reported_to_the_submitter() {
    let setup = Setup {
        decode_capacities: vec![1],
        config: SchedulerConfig {
            queue_capacity: 1,
            ..SchedulerConfig::default()
        },
        ..Setup::default()
    };
    let worker = spawn(&setup, 0);
    let handle = worker.handle();
    let mut running = handle.submit_blocking(spec(5, 900, 0)).unwrap();
    assert!(matches!(
        running.next_event().unwrap(),
        Some(Event::Admitted { cached_tokens: 0 })
    ));
    let _queued = handle.submit_blocking(spec(5, 5, 1)).unwrap();
    assert_eq!(
        handle.submit_blocking(spec(5, 5, 2)).unwrap_err(),
        AdmissionError::QueueFull { capacity: 1 }
    );
    worker.shutdown(ShutdownMode::Cancel).unwrap();
}

#[test]
fn a_startup_failure_is_returned_before_serving() {
    let setup = Setup::default();
    let result = Worker::spawn(
        setup.geometry(),
        SchedulerConfig::default(),
        || -> Result<helios::scheduler::test_executor::TestExecutor, _> {
            Err(ExecutionError::UnknownTicket { ticket: 0 })
        },
    );
    assert!(matches!(
        result,
        Err(SchedulerError::Execution(
            ExecutionError::UnknownTicket { .. }
        ))
    ));
    let invalid = Worker::spawn(
        setup.geometry(),
        SchedulerConfig {
            decode_depth: 3,
            ..SchedulerConfig::default()
        },
        move || Ok(setup.executor()),
    );
    assert!(matches!(
        invalid,
        Err(SchedulerError::Config {
            field: "decode_depth",
            ..
        })
    ));
}

#[test]
fn an_executor_failure_fails_requests_and_marks_the_worker_failed() {
    let setup = Setup::default();
    let executor_setup = setup.clone();
    let worker = Worker::spawn(setup.geometry(), setup.config.clone(), move || {
        let mut executor = executor_setup.executor();
        executor.fail_next();
        Ok(executor)
    })
    .unwrap();
    let handle = worker.handle();
    let log = drain(handle.submit_blocking(spec(5, 5, 0)).unwrap());
    assert!(matches!(log.failure, Some(ExecutionError::Device { .. })));
    let status = handle.status().unwrap();
    assert!(matches!(
        status.health,
        Health::Failed(ExecutionError::Device { .. })
    ));
    assert_eq!(
        handle.submit_blocking(spec(5, 5, 1)).unwrap_err(),
        AdmissionError::Unavailable
    );
    assert!(matches!(
        worker.shutdown(ShutdownMode::Finish),
        Err(SchedulerError::Execution(ExecutionError::Device { .. }))
    ));
}

/// With the prefix cache: clients branching from one conversation stream
/// their reference outputs through the model thread, the later ones restore
/// the shared prefix, and a shutdown that cancels everything while captures
/// are in flight joins cleanly, each stream ending once.
#[test]
fn cached_branches_stream_references_and_shutdown_drains_captures() {
    let setup = Setup {
        kv_pages: 120,
        ..Setup::default()
    }
    .with_cache(16, scheduler_support::dense_row());
    let worker = spawn(&setup, 2);
    let root = spec(300, 4, 1);
    let request = |seed: u64| {
        let mut request = spec(300, 12, seed);
        request.prompt = [&root.prompt[..], &request.prompt[..40]].concat();
        request.message_endpoints = vec![300];
        request
    };
    let log = drain(worker.handle().submit_blocking(request(2)).unwrap());
    assert_eq!(log.tokens, reference(&setup, &request(2)).tokens);
    let clients: Vec<_> = (3..9)
        .map(|seed| {
            let handle = worker.handle();
            let setup = setup.clone();
            let request = request(seed);
            thread::spawn(move || {
                let log = drain(handle.submit_blocking(request.clone()).unwrap());
                assert_eq!(log.tokens, reference(&setup, &request).tokens);
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    // A finished request's terminal capture and retirement follow its last
    // event: wait until only the cache holds pages.
    let started = std::time::Instant::now();
    let (metrics, cache) = loop {
        let metrics = worker.handle().status().unwrap().metrics;
        let cache = metrics.cache.unwrap();
        if metrics.pages_used == cache.pages_held && metrics.in_flight == 0 {
            break (metrics, cache);
        }
        assert!(
            started.elapsed().as_secs() < 10,
            "never settled: {metrics:?}"
        );
        thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(
        cache.counters.hits >= 6 && cache.counters.hit_tokens >= 6 * 300,
        "{cache:?}"
    );
    assert_eq!((metrics.running, metrics.pages_reserved), (0, 0));
    // Long requests, then a shutdown that cancels them mid-flight.
    let streams: Vec<RequestStream> = (20..24)
        .map(|seed| worker.handle().submit_blocking(request(seed)).unwrap())
        .collect();
    worker.shutdown(ShutdownMode::Cancel).unwrap();
    for stream in streams {
        let log = drain(stream);
        assert_eq!(log.terminal_events, 1, "{log:?}");
    }
}

#[test]
fn a_polling_model_thread_serves_requests_within_and_after_its_poll() {
    // A long poll: requests and the shutdown are taken as they come, never after
    // the poll ends. A short one: a request after it wakes the sleeping thread.
    for (spin, pauses) in [(30_000, [0, 5]), (20, [0, 200])] {
        let setup = Setup {
            config: SchedulerConfig {
                idle_spin: Duration::from_millis(spin),
                ..SchedulerConfig::default()
            },
            ..Setup::default()
        };
        let worker = spawn(&setup, 0);
        let handle = worker.handle();
        for (seed, pause) in pauses.into_iter().enumerate() {
            thread::sleep(Duration::from_millis(pause));
            let started = Instant::now();
            let request = spec(8, 12, seed as u64);
            let log = drain(handle.submit_blocking(request.clone()).unwrap());
            assert!(started.elapsed() < Duration::from_secs(10));
            let expected = reference(&setup, &request);
            assert_eq!(log.tokens, expected.tokens);
            assert_eq!(log.finish, Some(expected.reason));
        }
        let started = Instant::now();
        worker.shutdown(ShutdownMode::Finish).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
