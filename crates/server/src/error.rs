//! The server's own errors ([`Error`], for starting and running it) and the
//! errors a client sees ([`ApiError`], in OpenAI's JSON shape).

use engine::JobError;
use serde_json::json;

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cause is the error's source, printed once by the caller's chain.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Model(#[from] model::Error),
    #[error("--parallel must be at least 1")]
    NoSlots,
    #[error("{0}")]
    BadApiKey(String),
    #[error("{0}")]
    ModelChanged(String),
}

/// An error answered to a client:
/// `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (503).
    pub retry_after: Option<u32>,
    /// Close the connection after answering (`Connection: close`): the
    /// request's body was not read to its end.
    pub close: bool,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
            close: false,
        }
    }

    /// Answer with `Connection: close`.
    pub fn closing(self) -> ApiError {
        ApiError {
            close: true,
            ..self
        }
    }

    /// 417: an `Expect` header other than `100-continue`.
    pub fn expectation_failed(value: &str) -> ApiError {
        ApiError {
            code: Some("expectation_failed"),
            ..ApiError::new(
                417,
                "invalid_request_error",
                format!("Expect: {value} is not supported (only 100-continue)"),
            )
        }
    }

    /// 408: the body did not arrive in time.
    pub fn request_timeout(secs: f64) -> ApiError {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                408,
                "invalid_request_error",
                format!("The request body did not arrive within {secs:.0} s"),
            )
            .closing()
        }
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request_error", message)
    }

    /// 400 about one field.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message).with_param(param)
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                401,
                "invalid_request_error",
                "Incorrect or missing API key: send it as `Authorization: Bearer KEY`.",
            )
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                413,
                "invalid_request_error",
                format!("The request body is larger than the server's limit of {limit} bytes."),
            )
        }
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError {
            code: Some("not_found"),
            ..ApiError::new(
                404,
                "invalid_request_error",
                format!("No such route: {what}"),
            )
        }
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "invalid_request_error",
            "Method not allowed for this route.",
        )
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("server_overloaded"),
            retry_after: Some(1),
            ..ApiError::new(503, "server_error", message)
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "server_error", message)
    }

    /// Why the engine could not run a job, as the client hears it: the
    /// prompt's fault is a 400, a shutdown a 503, anything else a 500.
    pub fn from_job(e: &JobError) -> ApiError {
        match e {
            JobError::EmptyPrompt
            | JobError::PromptTooLong { .. }
            | JobError::TokenOutOfRange { .. } => ApiError::invalid(e.to_string()),
            JobError::ShuttingDown(why) => ApiError::unavailable(why.clone()),
            JobError::Internal | JobError::Memory(_) | JobError::Constraint(_) => {
                ApiError::internal(e.to_string())
            }
        }
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}
