//! The HTTP layer's errors and the one place they become HTTP statuses,
//! OpenAI envelopes and SSE error events.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::frontend::FrontendError;
use crate::scheduler::{AdmissionError, ErrorClass, ExecutionError};

/// A machine-readable error code, the envelope's `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The body could not be read (larger than the body limit).
    InvalidBody,
    /// The body is not JSON of the expected shape.
    InvalidJson,
    /// A parameter is out of range or unsupported.
    InvalidParameter,
    /// The conversation cannot be rendered into a prompt.
    InvalidPrompt,
    /// The prompt and output limit do not fit the core's contract.
    ContextLengthExceeded,
    /// The server cannot take the request now (queue full, pool too small,
    /// shutting down).
    CapacityExceeded,
    /// The scheduler's worker failed or is gone.
    WorkerUnavailable,
    /// Executing the admitted request failed.
    ExecutionFailed,
    /// The server cancelled the request before it finished (shutdown).
    Cancelled,
    /// The core's own assets failed (tokenizer, decoder).
    InternalError,
    /// The server requires an API key and the request has none, or a wrong one.
    InvalidApiKey,
    /// The request names a model this server does not serve.
    ModelNotFound,
    /// A message has a role the endpoint does not accept.
    InvalidRole,
    /// A content part the core cannot consume (an image, for now).
    UnsupportedContent,
    /// The output did not meet `tool_choice` (no completed call, or a call
    /// to a tool the choice excludes).
    ToolChoiceUnmet,
    /// `previous_response_id` names no stored response.
    PreviousResponseNotFound,
    /// A grammar (a JSON schema, a tool's schema) does not compile or is
    /// too large.
    InvalidGrammar,
}

impl ErrorCode {
    /// The code as the envelope and the logs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidBody => "invalid_body",
            Self::InvalidJson => "invalid_json",
            Self::InvalidParameter => "invalid_parameter",
            Self::InvalidPrompt => "invalid_prompt",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::CapacityExceeded => "capacity_exceeded",
            Self::WorkerUnavailable => "worker_unavailable",
            Self::ExecutionFailed => "execution_failed",
            Self::Cancelled => "cancelled",
            Self::InternalError => "internal_error",
            Self::InvalidApiKey => "invalid_api_key",
            Self::ModelNotFound => "model_not_found",
            Self::InvalidRole => "invalid_role",
            Self::UnsupportedContent => "unsupported_content",
            Self::ToolChoiceUnmet => "tool_choice_unmet",
            Self::PreviousResponseNotFound => "previous_response_not_found",
            Self::InvalidGrammar => "invalid_grammar",
        }
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Why a generation request was not answered with output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The body could not be read (larger than the body limit).
    #[error("cannot read the request body: {reason}")]
    UnreadableBody {
        /// Why.
        reason: String,
    },
    /// The body does not parse as the endpoint's request.
    #[error("invalid request body{}: {reason}", field.as_ref().map(|f| format!(" at `{f}`")).unwrap_or_default())]
    InvalidJson {
        /// The field whose value does not parse (`messages[2].content`),
        /// when the failure is inside one.
        field: Option<String>,
        /// The parser's message.
        reason: String,
    },
    /// A parameter is out of range or unsupported; `param` names it.
    #[error("{param} {reason}")]
    InvalidParameter {
        /// The request field.
        param: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The frontend could not build the prompt, or decode output.
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    /// The scheduler refused the request.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The admitted request failed on the executor.
    #[error(transparent)]
    Execution(#[from] ExecutionError),
    /// The scheduler's worker is gone.
    #[error("the scheduler worker is gone")]
    WorkerGone,
    /// The task preparing the prompt (rendering, tokenization) did not
    /// finish: it panicked or the runtime is shutting down.
    #[error("preparing the prompt failed")]
    PreparationFailed,
    /// The scheduler cancelled the request (shutdown) before it finished.
    #[error("the request was cancelled by the server before it finished")]
    Cancelled,
    /// The server was started with an API key and the request does not carry
    /// it (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    #[error(
        "a valid API key is required: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`"
    )]
    Unauthorized,
    /// The request names a model other than the served one (or an alias).
    #[error("the model `{requested}` does not exist: this server serves `{served}`")]
    ModelNotFound {
        /// The model the request named.
        requested: String,
        /// The served model id.
        served: String,
    },
    /// A message's role is not one the endpoint accepts.
    #[error("messages[{index}].role `{role}` is not accepted here: use one of {accepted}")]
    InvalidRole {
        /// The message's position in `messages`.
        index: usize,
        /// The role it gave.
        role: String,
        /// The roles the endpoint accepts, for the message.
        accepted: &'static str,
    },
    /// A content part the core cannot consume.
    #[error("{at} is a `{kind}` part, which this model cannot consume: it reads text only")]
    UnsupportedContent {
        /// Where: `messages[2].content[0]`, `system[1]`, ...
        at: String,
        /// The part's type.
        kind: String,
    },
    /// A tool definition is unusable.
    #[error(transparent)]
    InvalidTools(#[from] crate::frontend::protocol::ToolSetError),
    /// `tool_choice` names a tool the request does not declare.
    #[error("tool_choice names `{name}`, which is not one of the request's tools")]
    UnknownTool {
        /// The name.
        name: String,
    },
    /// The output did not meet the request's `tool_choice`.
    #[error("the response does not satisfy tool_choice: {reason}")]
    ToolChoiceUnmet {
        /// What the output did.
        reason: String,
    },
    /// A grammar the output must follow cannot be used.
    #[error("{param}: {reason}")]
    InvalidGrammar {
        /// The field that asked for it.
        param: &'static str,
        /// Why.
        reason: String,
    },
    /// `previous_response_id` names a response that is not stored (never
    /// stored, or evicted from the bounded store).
    #[error("previous response `{id}` is not found: it was not stored, or it was evicted")]
    PreviousResponseNotFound {
        /// The id.
        id: String,
    },
}

impl HttpError {
    /// The HTTP status: the request's fault is 400, the server's state 503,
    /// a failure while executing 500.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnreadableBody { .. }
            | Self::InvalidJson { .. }
            | Self::InvalidParameter { .. }
            | Self::InvalidRole { .. }
            | Self::UnsupportedContent { .. }
            | Self::InvalidTools(_)
            | Self::UnknownTool { .. }
            | Self::PreviousResponseNotFound { .. }
            | Self::InvalidGrammar { .. } => StatusCode::BAD_REQUEST,
            Self::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            Self::ToolChoiceUnmet { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Frontend(error) if frontend_is_request_fault(error) => StatusCode::BAD_REQUEST,
            Self::Frontend(_) | Self::Execution(_) | Self::PreparationFailed => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::Admission(error) => match error.class() {
                ErrorClass::InvalidRequest => StatusCode::BAD_REQUEST,
                ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            },
            Self::WorkerGone | Self::Cancelled => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
        }
    }

    /// The typed code of the envelope.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnreadableBody { .. } => ErrorCode::InvalidBody,
            Self::InvalidJson { .. } => ErrorCode::InvalidJson,
            Self::InvalidParameter { .. } => ErrorCode::InvalidParameter,
            Self::Frontend(FrontendError::EmptyStop { .. }) => ErrorCode::InvalidParameter,
            Self::Frontend(error) if frontend_is_request_fault(error) => ErrorCode::InvalidPrompt,
            Self::Frontend(_) | Self::PreparationFailed => ErrorCode::InternalError,
            Self::Admission(AdmissionError::ExceedsContext { .. }) => {
                ErrorCode::ContextLengthExceeded
            }
            Self::Admission(AdmissionError::Unavailable) => ErrorCode::WorkerUnavailable,
            Self::Admission(error) => match error.class() {
                ErrorClass::InvalidRequest => ErrorCode::InvalidParameter,
                ErrorClass::Unavailable => ErrorCode::CapacityExceeded,
            },
            Self::Execution(_) => ErrorCode::ExecutionFailed,
            Self::WorkerGone => ErrorCode::WorkerUnavailable,
            Self::Cancelled => ErrorCode::Cancelled,
            Self::Unauthorized => ErrorCode::InvalidApiKey,
            Self::ModelNotFound { .. } => ErrorCode::ModelNotFound,
            Self::InvalidRole { .. } => ErrorCode::InvalidRole,
            Self::UnsupportedContent { .. } => ErrorCode::UnsupportedContent,
            Self::InvalidTools(_) | Self::UnknownTool { .. } => ErrorCode::InvalidParameter,
            Self::ToolChoiceUnmet { .. } => ErrorCode::ToolChoiceUnmet,
            Self::PreviousResponseNotFound { .. } => ErrorCode::PreviousResponseNotFound,
            Self::InvalidGrammar { .. } => ErrorCode::InvalidGrammar,
        }
    }

    /// Where the request failed, for the logs.
    pub fn stage(&self) -> &'static str {
        match self {
            Self::UnreadableBody { .. }
            | Self::InvalidJson { .. }
            | Self::InvalidParameter { .. }
            | Self::ModelNotFound { .. }
            | Self::InvalidRole { .. }
            | Self::UnsupportedContent { .. }
            | Self::InvalidTools(_)
            | Self::UnknownTool { .. }
            | Self::PreviousResponseNotFound { .. }
            | Self::InvalidGrammar { .. } => "validation",
            Self::ToolChoiceUnmet { .. } => "output",
            Self::Frontend(error) if frontend_is_request_fault(error) => "validation",
            Self::Frontend(_) | Self::PreparationFailed => "frontend",
            Self::Admission(_) => "admission",
            Self::Execution(_) => "execution",
            Self::WorkerGone | Self::Cancelled => "scheduler",
            Self::Unauthorized => "authentication",
        }
    }

    /// The request field at fault, when one is.
    pub fn param(&self) -> Option<String> {
        let field: &str = match self {
            Self::InvalidParameter { param, .. } => param,
            Self::ModelNotFound { .. } => "model",
            Self::InvalidRole { index, .. } => return Some(format!("messages[{index}].role")),
            Self::InvalidJson { field, .. } => return field.clone(),
            Self::UnsupportedContent { at, .. } => at,
            Self::InvalidTools(
                crate::frontend::protocol::ToolSetError::NotAFunction { index }
                | crate::frontend::protocol::ToolSetError::Duplicate { index, .. },
            ) => return Some(format!("tools[{index}]")),
            Self::UnknownTool { .. } | Self::ToolChoiceUnmet { .. } => "tool_choice",
            Self::PreviousResponseNotFound { .. } => "previous_response_id",
            Self::InvalidGrammar { param, .. } => param,
            Self::Frontend(FrontendError::EmptyStop { .. }) => "stop",
            Self::Frontend(error) if frontend_is_request_fault(error) => "messages",
            Self::Admission(AdmissionError::ExceedsContext { .. }) => "max_tokens",
            Self::Admission(AdmissionError::ZeroOutputBudget) => "max_tokens",
            Self::Admission(AdmissionError::EmptyPrompt) => "prompt",
            Self::Admission(AdmissionError::InvalidSampling { field, .. }) => field,
            _ => return None,
        };
        Some(field.to_owned())
    }

    /// The OpenAI envelope: `{"error": {message, type, param, code}}`.
    pub fn envelope(&self) -> ErrorEnvelope {
        let kind = match self.status() {
            StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::UNPROCESSABLE_ENTITY => {
                "invalid_request_error"
            }
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            _ => "server_error",
        };
        ErrorEnvelope {
            error: ErrorBody {
                message: self.to_string(),
                kind,
                param: self.param(),
                code: self.code(),
            },
        }
    }
}

/// Logs a failed request on stderr, under the id its response's
/// `x-request-id` header carries: timestamp, request id, stage, code.
pub fn log_failure(request_id: &str, error: &HttpError) {
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    eprintln!(
        "{time} request_id={request_id} stage={} code={} status={}: {error}",
        error.stage(),
        error.code().as_str(),
        error.status().as_u16(),
    );
}

/// Frontend failures caused by the request's input rather than the core.
fn frontend_is_request_fault(error: &FrontendError) -> bool {
    matches!(
        error,
        FrontendError::InvalidChat { .. }
            | FrontendError::TemplateException { .. }
            | FrontendError::TemplateRender { .. }
            | FrontendError::NoChatTemplate
            | FrontendError::EmptyStop { .. }
            | FrontendError::Encode { .. }
            | FrontendError::GrammarUnavailable { .. }
    )
}

/// The OpenAI error envelope.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorEnvelope {
    /// The error.
    pub error: ErrorBody,
}

/// The body of an OpenAI error envelope.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field.
    pub message: String,
    /// The OpenAI error type (`invalid_request_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault (`messages[2].role`, ...).
    pub param: Option<String>,
    /// The typed code.
    pub code: ErrorCode,
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.envelope())).into_response()
    }
}

impl HttpError {
    /// Anthropic's envelope: `{"type": "error", "error": {type, message}}`.
    pub fn anthropic_envelope(&self) -> serde_json::Value {
        let kind = match self.status() {
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "invalid_request_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            _ => "api_error",
        };
        serde_json::json!({
            "type": "error",
            "error": {"type": kind, "message": self.to_string()},
        })
    }
}

/// An [`HttpError`] answered in Anthropic's envelope (`/v1/messages`).
#[derive(Debug)]
pub struct AnthropicError(pub HttpError);

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        (self.0.status(), Json(self.0.anthropic_envelope())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_preparation_is_the_servers_fault() {
        let error = HttpError::PreparationFailed;
        assert_eq!(error.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(error.code().as_str(), "internal_error");
        assert_eq!(error.stage(), "frontend");
        assert_eq!(error.param(), None);
    }
}
