//! What both servers derive from a validated core before its graphs run:
//! the native frontend, the declared geometry, and the scheduler's and the
//! HTTP layer's configuration.

use std::sync::Arc;

use super::ServeError;
use crate::core::ValidCore;
use crate::frontend::Frontend;
use crate::http::{marked_messages, SamplingPolicy, ServeConfig};
use crate::scheduler::{Geometry, PrefixConfig, SchedulerConfig};

/// The serving options both servers share.
#[derive(Debug, Clone)]
pub(super) struct Admission {
    /// The model id `/v1/models` lists.
    pub(super) model: String,
    /// Other names requests may give the model.
    pub(super) aliases: Vec<String>,
    /// When set, every `/v1` route requires it.
    pub(super) api_key: Option<String>,
    /// The largest request body accepted, in bytes.
    pub(super) max_body_bytes: usize,
    /// Requests the admission queue holds.
    pub(super) queue_capacity: usize,
    /// Reuse exact prefix checkpoints across requests.
    pub(super) prefix_cache: bool,
    /// Offer the cache the endpoints of at most this many last messages of
    /// a chat (None: as many as a request may capture).
    pub(super) message_checkpoints: Option<usize>,
    /// How long the model thread polls for work once idle before sleeping.
    pub(super) idle_spin: std::time::Duration,
}

/// A core's serving plan.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) frontend: Arc<Frontend>,
    /// The prepared geometry (a loaded core may back fewer KV pages).
    pub(super) geometry: Geometry,
    pub(super) scheduler: SchedulerConfig,
    pub(super) http: ServeConfig,
}

/// The plan of `core` under `admission`.
pub(super) fn plan(core: &ValidCore, admission: Admission) -> Result<Plan, ServeError> {
    let frontend = Arc::new(Frontend::from_core(core.frontend())?);
    let geometry = Geometry::from_core(core)?;
    let prefix = (admission.prefix_cache)
        .then(|| PrefixConfig::from_core(core))
        .transpose()?;
    let http = ServeConfig {
        model: admission.model,
        aliases: admission.aliases,
        sampling: SamplingPolicy::from_core(core.sampling()),
        context_limit: geometry.context_limit(),
        max_body_bytes: admission.max_body_bytes,
        api_key: admission.api_key,
        marked_messages: marked_messages(
            prefix.as_ref(),
            geometry.max_concurrency(),
            admission.message_checkpoints,
        ),
        // Cores exported before token masks cannot constrain decoding.
        constrained: core.takes_token_masks(),
    };
    let scheduler = SchedulerConfig {
        queue_capacity: admission.queue_capacity,
        prefix,
        idle_spin: admission.idle_spin,
        ..SchedulerConfig::default()
    };
    Ok(Plan {
        frontend,
        geometry,
        scheduler,
        http,
    })
}
