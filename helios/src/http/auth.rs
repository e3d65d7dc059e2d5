//! The optional API key: every `/v1` route requires it when the server was
//! started with one; `/health` and `/metrics` stay open for probes.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{log_failure, AnthropicError, HttpError};
use super::{new_request_id, AppState, REQUEST_ID_HEADER};

/// The key a request presents: `Authorization: Bearer KEY` (OpenAI clients)
/// or `x-api-key: KEY` (Anthropic clients).
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let value = value.as_bytes();
        let prefix = b"Bearer ";
        if value.len() > prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix) {
            return Some(&value[prefix.len()..]);
        }
    }
    headers.get("x-api-key").map(|value| value.as_bytes())
}

/// Compares in time independent of where the bytes first differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a request without the configured key with 401, in the envelope
/// of the endpoint's API.
pub(super) async fn require_key(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = state.config().api_key.as_deref() else {
        return next.run(request).await;
    };
    if presented(request.headers()).is_some_and(|given| same(given, key.as_bytes())) {
        return next.run(request).await;
    }
    let request_id = new_request_id();
    let error = HttpError::Unauthorized;
    log_failure(&request_id, &error);
    let mut response = if request.uri().path() == "/v1/messages" {
        AnthropicError(error).into_response()
    } else {
        error.into_response()
    };
    if let Ok(value) = request_id.parse() {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_key_comes_from_either_header() {
        assert_eq!(
            presented(&headers(&[("authorization", "Bearer sk-1")])),
            Some(&b"sk-1"[..])
        );
        assert_eq!(
            presented(&headers(&[("authorization", "bearer sk-1")])),
            Some(&b"sk-1"[..])
        );
        assert_eq!(
            presented(&headers(&[("x-api-key", "sk-2")])),
            Some(&b"sk-2"[..])
        );
        assert_eq!(presented(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(presented(&headers(&[])), None);
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }
}
