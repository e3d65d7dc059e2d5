//! Shared setup of the HTTP tests: the router over a worker running the
//! test executor, with the frontend of the tiny core fixture.
#![allow(dead_code)] // each test crate uses a different part

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use axum::Router;
use helios::core::load_manifest;
use helios::core::proto::SamplingDefaults;
use helios::frontend::{Frontend, Tokenizer};
use helios::http::{marked_messages, router, AppState, SamplingPolicy, ServeConfig};
use helios::scheduler::test_executor::{FakeModel, TestExecutor};
use helios::scheduler::{
    Completion, ExecutionError, Executor, Geometry, Launch, Operation, PrefixConfig,
    SamplingParams, SchedulerConfig, SchedulerHandle, Ticket, Worker,
};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// The model id the test server lists.
pub const MODEL: &str = "tiny";

/// Another name the test server answers to.
pub const ALIAS: &str = "tiny-alias";

/// How the test server is built.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The fake model samples EOS about once every this many draws.
    pub stop_every: Option<u64>,
    /// Each launch takes this long on the executor.
    pub launch_time: Option<Duration>,
    /// Make the first launch fail.
    pub fail_first_launch: bool,
    /// Require this API key on the `/v1` routes.
    pub api_key: Option<String>,
    /// Serve without the prefix cache (it is on by default, over 16 rows).
    pub no_prefix_cache: bool,
    /// Offer the cache at most this many message endpoints per chat.
    pub message_checkpoints: Option<usize>,
    /// Serve these sampling defaults instead of the fixture's.
    pub sampling: Option<SamplingDefaults>,
}

/// Snapshot rows of the test server's prefix cache.
pub const SNAPSHOT_ROWS: u32 = 16;

/// A router over a running worker.
pub struct Server {
    pub worker: Option<Worker>,
    pub handle: SchedulerHandle,
    pub router: Router,
    pub frontend: Arc<Frontend>,
    pub model: FakeModel,
    pub context_limit: u32,
    /// What every admission launch carried, in order.
    pub admissions: Admissions,
}

/// What one admission launch carried.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub sampling: SamplingParams,
    pub seed: u64,
    pub prompt: Vec<u32>,
}

/// Every admission the executor ran, in order.
pub type Admissions = Arc<Mutex<Vec<Admitted>>>;

/// The test executor, slowed down to make a request outlast a client.
struct Slow {
    inner: TestExecutor,
    launch_time: Option<Duration>,
    admissions: Admissions,
}

impl Executor for Slow {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        if let Some(time) = self.launch_time {
            std::thread::sleep(time);
        }
        if let Operation::Admit(admit) = &launch.operation {
            (self.admissions.lock().unwrap()).push(Admitted {
                sampling: admit.sampling,
                seed: admit.seed,
                prompt: admit.prompt.clone(),
            });
        }
        self.inner.submit(launch)
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        self.inner.poll(ticket)
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        self.inner.wait(ticket)
    }
}

pub fn server(options: Options) -> Server {
    let core_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let core = load_manifest(&core_dir).unwrap();
    let frontend = Arc::new(Frontend::from_core(core.frontend()).unwrap());
    // The fixture's pool is tiny; the HTTP tests need room for long outputs.
    let mut contract = core.contract().clone();
    contract.kv_pages = 129;
    contract.context_limit = 1024;
    let geometry = Geometry::from_contract(&contract, frontend.eos_token_ids()).unwrap();
    let model = FakeModel::new(&geometry, options.stop_every);
    let executor_model = model.clone();
    let executor_geometry = geometry.clone();
    let prefix = (!options.no_prefix_cache).then(|| PrefixConfig {
        snapshot_rows: SNAPSHOT_ROWS,
        ..PrefixConfig::from_core(&core).unwrap()
    });
    let marked = marked_messages(
        prefix.as_ref(),
        geometry.max_concurrency(),
        options.message_checkpoints,
    );
    let config = SchedulerConfig {
        prefix,
        ..SchedulerConfig::default()
    };
    let admissions = Admissions::default();
    let recorded = Arc::clone(&admissions);
    let worker = Worker::spawn(geometry.clone(), config, move || {
        let mut inner =
            TestExecutor::with_snapshot_rows(&executor_geometry, executor_model, SNAPSHOT_ROWS);
        if options.fail_first_launch {
            inner.fail_next();
        }
        Ok(Slow {
            inner,
            launch_time: options.launch_time,
            admissions: recorded,
        })
    })
    .unwrap();
    let handle = worker.handle();
    let config = ServeConfig {
        model: MODEL.to_owned(),
        aliases: vec![ALIAS.to_owned()],
        sampling: SamplingPolicy::from_core(options.sampling.as_ref().unwrap_or(core.sampling())),
        context_limit: geometry.context_limit(),
        max_body_bytes: 64 * 1024,
        api_key: options.api_key.clone(),
        marked_messages: marked,
        constrained: true,
    };
    let state = AppState::new(handle.clone(), Arc::clone(&frontend), config);
    Server {
        worker: Some(worker),
        handle,
        router: router(state),
        frontend,
        model,
        context_limit: geometry.context_limit(),
        admissions,
    }
}

impl Server {
    /// Sends one request to the router.
    pub async fn send(&self, request: Request<Body>) -> Response {
        self.router.clone().oneshot(request).await.unwrap()
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &str) -> Response {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        self.send(request).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Response {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.frontend.tokenizer()
    }
}

/// The whole body as text.
pub async fn body_text(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The whole body as JSON.
pub async fn body_json(response: Response) -> Value {
    serde_json::from_str(&body_text(response).await).unwrap()
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.trim_start().to_owned())
        .collect()
}

/// Asserts an OpenAI error envelope with `status` and `code`.
pub async fn assert_error(response: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(response.status(), status);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some(), "{body}");
    body
}

/// A chat request body for one user message.
pub fn chat_body(content: &str, extra: Value) -> String {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body.to_string()
}

/// What the server must answer to a chat request: the prompt's token count,
/// the fake model's output tokens and their text.
pub struct Expected {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    pub text: String,
    pub stopped_by_eos: bool,
}

impl Server {
    /// The reference output of a one-message chat.
    pub fn expected(&self, content: &str, max_tokens: u32, seed: u64) -> Expected {
        let input = helios::frontend::ChatInput {
            messages: vec![serde_json::json!({"role": "user", "content": content})],
            add_generation_prompt: true,
            ..Default::default()
        };
        let prompt = self.frontend.encode_chat(&input).unwrap().token_ids;
        self.expected_for(&prompt, max_tokens, seed)
    }

    /// The reference output of a prompt of token ids.
    pub fn expected_for(&self, prompt: &[u32], max_tokens: u32, seed: u64) -> Expected {
        let reference = self.model.reference(prompt, max_tokens, seed);
        let tokenizer = self.tokenizer();
        let visible: Vec<u32> = (reference.tokens.iter().copied())
            .filter(|&id| tokenizer.knows(id) && !tokenizer.is_special(id))
            .collect();
        // The server decodes the output after the last prompt tokens.
        let context = &prompt[prompt.len().saturating_sub(4)..];
        let before = tokenizer.decode(context, true).unwrap();
        let all = tokenizer
            .decode(&[context, &visible].concat(), true)
            .unwrap();
        Expected {
            prompt_tokens: prompt.len(),
            tokens: reference.tokens,
            text: all[before.len()..].to_owned(),
            stopped_by_eos: reference.reason == helios::scheduler::FinishReason::Stop,
        }
    }
}
