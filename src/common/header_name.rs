//! A request header name as the configuration gives it: checked once, stored lower-cased.

use super::ConfigError;

/// A valid HTTP header name (RFC 9110 token characters), lower-cased as Envoy keeps header names,
/// so `X-Session-Id` in a configuration means `x-session-id`; pseudo-headers (`:path`) are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderName(String);

impl HeaderName {
    /// `name` checked for the configuration field `field`.
    pub fn parse(field: &str, name: &str) -> Result<HeaderName, ConfigError> {
        let lower = name.to_ascii_lowercase();
        let token = !lower.is_empty()
            && lower.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(&b)
            });
        if token {
            Ok(HeaderName(lower))
        } else {
            Err(ConfigError::at(
                field,
                format!("`{name}` is not an HTTP header name"),
            ))
        }
    }

    /// An optional header: empty turns its feature off.
    pub fn optional(field: &str, name: &str) -> Result<Option<HeaderName>, ConfigError> {
        if name.is_empty() {
            Ok(None)
        } else {
            HeaderName::parse(field, name).map(Some)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_checked() {
        assert_eq!(
            HeaderName::parse("f", "X-Session-Id").unwrap().as_str(),
            "x-session-id"
        );
        for bad in ["x session", ":path", "x\u{e9}", ""] {
            assert_eq!(HeaderName::parse("f", bad).unwrap_err().field, "f", "{bad}");
        }
        assert_eq!(HeaderName::optional("f", "").unwrap(), None);
    }
}
