//! What kvroute answers itself: an OpenAI-style error with a stable code.

/// A stable, machine-readable reason, in the error body's `code` and the `x-kvroute-error` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BadPriority,
    BadSlo,
    Saturated,
    SloUnattainable,
    UnknownModel,
    NoHealthyPod,
    NoPods,
    MetricsNotProxied,
    BodyTooLarge,
    ParseBudgetExceeded,
    UnparseableBody,
    QueueFull,
    QueueTimeout,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadPriority => "bad_priority",
            ErrorCode::BadSlo => "bad_slo",
            ErrorCode::Saturated => "saturated",
            ErrorCode::SloUnattainable => "slo_unattainable",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::NoHealthyPod => "no_healthy_pod",
            ErrorCode::NoPods => "no_pods",
            ErrorCode::MetricsNotProxied => "metrics_not_proxied",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::ParseBudgetExceeded => "parse_budget_exceeded",
            ErrorCode::UnparseableBody => "unparseable_body",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::QueueTimeout => "queue_timeout",
        }
    }

    fn status_and_kind(self) -> (u32, &'static str) {
        match self {
            ErrorCode::BadPriority | ErrorCode::BadSlo | ErrorCode::UnparseableBody => {
                (400, "BadRequestError")
            }
            ErrorCode::BodyTooLarge | ErrorCode::ParseBudgetExceeded => (413, "BadRequestError"),
            ErrorCode::Saturated
            | ErrorCode::SloUnattainable
            | ErrorCode::QueueFull
            | ErrorCode::QueueTimeout => (429, "RateLimitError"),
            ErrorCode::UnknownModel | ErrorCode::MetricsNotProxied => (404, "NotFoundError"),
            ErrorCode::NoHealthyPod | ErrorCode::NoPods => (503, "ServiceUnavailableError"),
        }
    }
}

/// A response kvroute gives itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// An OpenAI-shaped JSON error.
    pub fn error(code: ErrorCode, message: &str) -> Reply {
        let (status, kind) = code.status_and_kind();
        let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code.as_str()}});
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("x-kvroute-error", code.as_str().to_string()),
        ];
        if status == 429 {
            headers.push(("retry-after", "1".to_string()));
        }
        Reply {
            status,
            headers,
            body: body.to_string().into_bytes(),
        }
    }

    /// The reply with `Retry-After: seconds` (a 429's default is 1).
    pub fn retry_after(mut self, seconds: u64) -> Reply {
        self.headers.retain(|(name, _)| *name != "retry-after");
        self.headers.push(("retry-after", seconds.to_string()));
        self
    }
}
