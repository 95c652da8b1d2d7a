//! Reading the few members of an object that decide how it renders (a content part's `type`, a
//! tool call's `function`), checking the whole value as `serde_json::Value` would.

use super::json::{enter, skip_map, skip_seq, sub_parse, validate_raw, Key, Validate};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// The members of an object that decide how it renders, each the last of its key: the first pass
/// over a content part, a tool call or a Responses item. It also checks the whole value.
#[derive(Default)]
pub struct Scan<'de> {
    /// String members, by key.
    pub strings: Vec<(&'static str, Option<Cow<'de, str>>)>,
    /// Members captured whole, by key (`None`: absent).
    pub raws: Vec<(&'static str, Option<&'de RawValue>)>,
}

impl<'de> Scan<'de> {
    pub fn string(&self, key: &str) -> Option<&str> {
        self.strings
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.as_deref())
    }
    pub fn raw(&self, key: &str) -> Option<&'de RawValue> {
        self.raws
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| *v)
    }
}

/// Reads `raw` (nested in `depth` containers), keeping the last string of each `strings` key and
/// the last value of each `raws` key; everything is checked as `serde_json::Value` would check it.
pub fn scan<'de>(
    raw: &'de RawValue,
    depth: usize,
    strings: &[&'static str],
    raws: &[&'static str],
) -> Result<Scan<'de>, serde_json::Error> {
    sub_parse(
        raw,
        ScanSeed {
            depth,
            strings,
            raws,
        },
    )
}

struct ScanSeed<'k> {
    depth: usize,
    strings: &'k [&'static str],
    raws: &'k [&'static str],
}

impl<'de> DeserializeSeed<'de> for ScanSeed<'_> {
    type Value = Scan<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scan<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

/// A string member's value: the string, or `None` for anything else (checked).
pub struct StringOrNone {
    pub depth: usize,
}

impl<'de> DeserializeSeed<'de> for StringOrNone {
    type Value = Option<Cow<'de, str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringOrNone {
    type Value = Option<Cow<'de, str>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq, self.depth).map(|_| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map, self.depth).map(|_| None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

impl<'de> Visitor<'de> for ScanSeed<'_> {
    type Value = Scan<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scan<'de>, A::Error> {
        let depth = enter(self.depth)?;
        let mut scan = Scan {
            strings: self.strings.iter().map(|k| (*k, None)).collect(),
            raws: self.raws.iter().map(|k| (*k, None)).collect(),
        };
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if let Some(slot) = scan.raws.iter_mut().find(|(k, _)| *k == key.0) {
                let raw = map.next_value::<&'de RawValue>()?;
                validate_raw(raw, depth).map_err(de::Error::custom)?;
                slot.1 = Some(raw);
                // A key can be wanted both ways (a part's `text`): read its string too.
                if let Some(slot) = scan.strings.iter_mut().find(|(k, _)| *k == key.0) {
                    slot.1 = sub_parse(raw, StringOrNone { depth }).map_err(de::Error::custom)?;
                }
            } else if let Some(slot) = scan.strings.iter_mut().find(|(k, _)| *k == key.0) {
                slot.1 = map.next_value_seed(StringOrNone { depth })?;
            } else {
                map.next_value_seed(Validate { depth })?;
            }
        }
        Ok(scan)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scan<'de>, A::Error> {
        skip_seq(seq, self.depth).map(|_| Scan::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
    fn visit_unit<E>(self) -> Result<Scan<'de>, E> {
        Ok(Scan::default())
    }
}

/// The last member named `key` of an already checked object, if it is one.
pub(super) fn member<'de>(
    raw: &'de RawValue,
    key: &str,
) -> Result<Option<&'de RawValue>, serde_json::Error> {
    struct Find<'k>(&'k str);
    impl<'de> DeserializeSeed<'de> for Find<'_> {
        type Value = Option<&'de RawValue>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(k) = map.next_key::<Key<'de>>()? {
                if k.0 == self.0 {
                    found = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    sub_parse(raw, Find(key))
}

/// The string in an already checked value, if it is one.
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    sub_parse(raw, StringOrNone { depth: 0 }).ok().flatten()
}
