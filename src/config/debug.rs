//! `debug_header`: who gets the `x-kvroute-debug` response header. Its line names pod addresses,
//! queue estimates and the index's state, so besides on (`true`, every client: only for a gateway
//! no untrusted client reaches) and off, it can be given per request: only a request carrying
//! `trigger_header` with the configured token gets it, and the trigger header never reaches a pod.

use super::{ConfigError, HeaderName, Secret};
use serde::{Deserialize, Deserializer};

/// The header a trusted client sends its token in, unless configured otherwise.
pub const DEFAULT_TRIGGER_HEADER: &str = "x-kvroute-debug-token";

/// A token shorter than this could be guessed by a client trying tokens against the gateway.
const MIN_TOKEN_CHARS: usize = 16;

/// The wire form: `true`/`false`, or `{trigger_header, token | token_env}`.
#[derive(Debug, Clone, PartialEq)]
pub enum DebugHeaderWire {
    Everyone(bool),
    Trusted(TriggerWire),
}

impl Default for DebugHeaderWire {
    fn default() -> Self {
        DebugHeaderWire::Everyone(false)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerWire {
    #[serde(default = "default_trigger_header")]
    pub trigger_header: String,
    /// The token itself, or `token_env`: the Wasm VM's environment variable holding it (Envoy's
    /// `vm_config.environment_variables`), so it need not sit in the plugin configuration.
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_env: Option<String>,
}

fn default_trigger_header() -> String {
    DEFAULT_TRIGGER_HEADER.to_string()
}

// By hand rather than `#[serde(untagged)]`: an untagged enum's error names neither the field nor
// what was wrong in the object.
impl<'de> Deserialize<'de> for DebugHeaderWire {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::Bool(on) => Ok(DebugHeaderWire::Everyone(on)),
            object @ serde_json::Value::Object(_) => serde_json::from_value(object)
                .map(DebugHeaderWire::Trusted)
                .map_err(|e| D::Error::custom(format!("field `debug_header`: {e}"))),
            other => Err(D::Error::custom(format!(
                "field `debug_header`: expected true, false or {{\"trigger_header\", \"token\"}}, got {other}"
            ))),
        }
    }
}

/// Requests that get the debug header: those carrying `header` with `token`.
#[derive(Debug, Clone, PartialEq)]
pub struct DebugTrigger {
    pub header: HeaderName,
    pub token: Secret,
}

impl DebugTrigger {
    /// Whether a request whose trigger header has this value (if any) gets the debug header.
    pub fn admits(&self, value: Option<&str>) -> bool {
        value.is_some_and(|v| self.token.matches(v.trim()))
    }
}

/// `(debug line built at all, only for requests with this trigger)`.
pub fn compile(wire: &DebugHeaderWire) -> Result<(bool, Option<DebugTrigger>), ConfigError> {
    let trigger = match wire {
        DebugHeaderWire::Everyone(on) => return Ok((*on, None)),
        DebugHeaderWire::Trusted(trigger) => trigger,
    };
    let header = HeaderName::parse("debug_header.trigger_header", &trigger.trigger_header)?;
    if header.as_str() == crate::headers::DEBUG {
        return Err(ConfigError::at(
            "debug_header.trigger_header",
            "must differ from the response header x-kvroute-debug",
        ));
    }
    let token = match (&trigger.token, &trigger.token_env) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::at(
                "debug_header.token_env",
                "set token or token_env, not both",
            ))
        }
        (Some(token), None) => token.clone(),
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            ConfigError::at(
                "debug_header.token_env",
                format!("the Wasm VM has no environment variable `{var}` (set it in vm_config.environment_variables)"),
            )
        })?,
        (None, None) => {
            return Err(ConfigError::at(
                "debug_header.token",
                "a trigger needs a token (or token_env)",
            ))
        }
    };
    let token = token.trim();
    if token.chars().count() < MIN_TOKEN_CHARS || !token.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Err(ConfigError::at(
            "debug_header.token",
            format!("must be at least {MIN_TOKEN_CHARS} visible ASCII characters"),
        ));
    }
    Ok((
        true,
        Some(DebugTrigger {
            header,
            token: Secret(token.to_string()),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    const TOKEN: &str = "0123456789abcdef-trusted";

    #[test]
    fn true_and_false_keep_their_meaning() {
        let on = Config::parse(br#"{"debug_header": true}"#).unwrap();
        assert!(on.debug_header && on.debug_trigger.is_none());
        let off = Config::parse(br#"{"debug_header": false}"#).unwrap();
        assert!(!off.debug_header && off.debug_trigger.is_none());
        assert!(!Config::parse(b"").unwrap().debug_header);
    }

    #[test]
    fn a_trigger_admits_only_its_exact_token() {
        let c = Config::parse(
            format!(
                r#"{{"debug_header": {{"trigger_header": "X-Debug-Me", "token": "{TOKEN}"}}}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        assert!(c.debug_header);
        let trigger = c.debug_trigger.unwrap();
        assert_eq!(trigger.header.as_str(), "x-debug-me");
        assert!(trigger.admits(Some(TOKEN)));
        assert!(
            trigger.admits(Some(&format!(" {TOKEN} "))),
            "header whitespace"
        );
        assert!(!trigger.admits(None));
        assert!(!trigger.admits(Some("")));
        assert!(!trigger.admits(Some(&TOKEN[..TOKEN.len() - 1])), "a prefix");
        assert!(!trigger.admits(Some(&format!("{TOKEN}x"))), "longer");
        assert!(
            !trigger.admits(Some(&TOKEN.replace('0', "1"))),
            "one byte off"
        );
        assert!(
            !format!("{trigger:?}").contains(TOKEN),
            "the token is never printed"
        );
    }

    #[test]
    fn the_default_trigger_header_and_bad_triggers() {
        let c = Config::parse(format!(r#"{{"debug_header": {{"token": "{TOKEN}"}}}}"#).as_bytes())
            .unwrap();
        assert_eq!(
            c.debug_trigger.unwrap().header.as_str(),
            super::DEFAULT_TRIGGER_HEADER
        );
        for (json, field) in [
            (r#"{"debug_header": {}}"#, "debug_header.token"),
            (
                r#"{"debug_header": {"token": "short"}}"#,
                "debug_header.token",
            ),
            (
                r#"{"debug_header": {"token": "0123456789abcdef", "token_env": "X"}}"#,
                "debug_header.token_env",
            ),
            (
                r#"{"debug_header": {"token_env": "KVROUTE_NO_SUCH_VARIABLE"}}"#,
                "debug_header.token_env",
            ),
            (
                r#"{"debug_header": {"trigger_header": "x-kvroute-debug", "token": "0123456789abcdef"}}"#,
                "debug_header.trigger_header",
            ),
            (
                r#"{"debug_header": {"tokn": "0123456789abcdef"}}"#,
                "debug_header",
            ),
            (r#"{"debug_header": "yes"}"#, "debug_header"),
        ] {
            let e = Config::parse(json.as_bytes()).unwrap_err();
            assert_eq!(e.field, field, "{json}: {e}");
        }
    }
}
