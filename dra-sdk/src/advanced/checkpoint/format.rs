//! The bytes of `checkpoint.json`: envelope, checksum, payload.
//!
//! ```text
//! {"version":1,"checksum":"sha256:<hex>","data":{"bootId":"…","claims":{"<uid>":{…}}}}
//! ```
//!
//! The checksum covers the exact bytes of `data` as they appear in the file, so it never depends
//! on how a reader would re-serialize the payload (the trap the Go drivers fell into when a new
//! field changed the re-serialized bytes). Unknown fields at every level are kept.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::record::ClaimRecord;

/// The format version this SDK writes.
pub(super) const FORMAT_VERSION: u32 = 1;

const CHECKSUM_PREFIX: &str = "sha256:";

/// Why a checkpoint file could not be used. The file is moved aside and the driver starts from an
/// empty checkpoint (see [`OpenReport`](super::OpenReport)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// The file has no bytes (typical after a power loss, since writes are not fsynced).
    #[error("the file is empty")]
    Empty,
    /// The file is not a JSON object.
    #[error("the file is not a JSON object: {0}")]
    InvalidJson(String),
    /// A mandatory field is missing (`version`, `checksum`, `data`, `data.bootId`).
    #[error("field `{0}` is missing")]
    MissingField(&'static str),
    /// A field has the wrong type.
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField {
        /// JSON path of the field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `version` is below 1 (no such format was ever written).
    #[error("format version {0} is not supported (versions start at 1)")]
    UnsupportedVersion(u64),
    /// The checksum is not `sha256:<hex>`.
    #[error("checksum {0:?} does not have the form `sha256:<hex>`")]
    UnknownChecksumAlgorithm(String),
    /// The payload does not hash to the recorded checksum.
    #[error("checksum mismatch: the file records {recorded}, its data hashes to {computed}")]
    ChecksumMismatch {
        /// Checksum stored in the file.
        recorded: String,
        /// Checksum of the `data` bytes.
        computed: String,
    },
}

/// A claim as stored, with the exact JSON of its record.
///
/// Keeping the JSON means a write only serializes the claims it changes; the others are copied
/// as they were read or last written (which also keeps another writer's bytes exactly).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StoredClaim {
    Known {
        record: ClaimRecord,
        json: Box<str>,
    },
    /// A record that does not deserialize (e.g. a newer SDK changed a field's type). It is not
    /// served, but written back unchanged unless the claim is put or removed.
    Unreadable {
        json: Box<str>,
        reason: String,
    },
}

impl StoredClaim {
    pub(super) fn from_record(record: ClaimRecord) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_string(&record)?.into_boxed_str();
        Ok(Self::Known { record, json })
    }

    pub(super) fn known(&self) -> Option<&ClaimRecord> {
        match self {
            Self::Known { record, .. } => Some(record),
            Self::Unreadable { .. } => None,
        }
    }

    fn json(&self) -> &str {
        match self {
            Self::Known { json, .. } | Self::Unreadable { json, .. } => json,
        }
    }
}

/// Everything a checkpoint file holds, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Contents {
    /// Version found in the file (what we write is always [`FORMAT_VERSION`]).
    pub(super) version: u32,
    pub(super) boot_id: String,
    pub(super) claims: BTreeMap<String, StoredClaim>,
    /// Unknown fields inside `data`.
    pub(super) data_unknown: Map<String, Value>,
    /// Unknown fields next to `version`, `checksum`, `data` (not covered by the checksum).
    pub(super) envelope_unknown: Map<String, Value>,
}

impl Contents {
    pub(super) fn empty(boot_id: &str) -> Self {
        Self {
            version: FORMAT_VERSION,
            boot_id: boot_id.to_owned(),
            claims: BTreeMap::new(),
            data_unknown: Map::new(),
            envelope_unknown: Map::new(),
        }
    }
}

/// Serializes `contents` as format [`FORMAT_VERSION`], keeping unknown fields.
///
/// Assembled by hand: claims are copied from their stored JSON, and the envelope must carry
/// `data` byte for byte as hashed.
pub(super) fn encode(contents: &Contents) -> Result<Vec<u8>, serde_json::Error> {
    let claims_len: usize = contents
        .claims
        .iter()
        .map(|(uid, claim)| uid.len() + claim.json().len() + 4)
        .sum();
    let mut data = Vec::with_capacity(claims_len + 128);
    data.extend_from_slice(b"{\"bootId\":");
    serde_json::to_writer(&mut data, &contents.boot_id)?;
    data.extend_from_slice(b",\"claims\":{");
    for (i, (uid, claim)) in contents.claims.iter().enumerate() {
        if i > 0 {
            data.push(b',');
        }
        serde_json::to_writer(&mut data, uid)?;
        data.push(b':');
        data.extend_from_slice(claim.json().as_bytes());
    }
    data.push(b'}');
    write_fields(&mut data, &contents.data_unknown)?;
    data.push(b'}');

    let mut out = Vec::with_capacity(data.len() + 128);
    out.extend_from_slice(format!("{{\"version\":{FORMAT_VERSION},\"checksum\":").as_bytes());
    serde_json::to_writer(&mut out, &checksum_of(&data))?;
    out.extend_from_slice(b",\"data\":");
    out.extend_from_slice(&data);
    write_fields(&mut out, &contents.envelope_unknown)?;
    out.extend_from_slice(b"}\n");
    Ok(out)
}

/// Appends `,"key":value` for each field.
fn write_fields(out: &mut Vec<u8>, fields: &Map<String, Value>) -> Result<(), serde_json::Error> {
    for (key, value) in fields {
        out.push(b',');
        serde_json::to_writer(&mut *out, key)?;
        out.push(b':');
        serde_json::to_writer(&mut *out, value)?;
    }
    Ok(())
}

/// Parses and verifies a checkpoint file.
pub(super) fn decode(bytes: &[u8]) -> Result<Contents, Corruption> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Corruption::Empty);
    }
    let text =
        std::str::from_utf8(bytes).map_err(|err| Corruption::InvalidJson(err.to_string()))?;
    let mut envelope: BTreeMap<String, &RawValue> =
        serde_json::from_str(text).map_err(|err| Corruption::InvalidJson(err.to_string()))?;

    let version = envelope
        .remove("version")
        .ok_or(Corruption::MissingField("version"))?;
    let version: u64 =
        serde_json::from_str(version.get()).map_err(|err| Corruption::InvalidField {
            field: "version",
            reason: err.to_string(),
        })?;
    if version == 0 {
        return Err(Corruption::UnsupportedVersion(version));
    }
    // Saturate: a far-future version is still "newer", and is read best-effort like any other.
    let version = u32::try_from(version).unwrap_or(u32::MAX);

    let checksum = envelope
        .remove("checksum")
        .ok_or(Corruption::MissingField("checksum"))?;
    let recorded: String =
        serde_json::from_str(checksum.get()).map_err(|err| Corruption::InvalidField {
            field: "checksum",
            reason: err.to_string(),
        })?;
    let data = envelope
        .remove("data")
        .ok_or(Corruption::MissingField("data"))?;
    verify_checksum(&recorded, data.get().as_bytes())?;

    let mut fields: BTreeMap<String, &RawValue> =
        serde_json::from_str(data.get()).map_err(|err| Corruption::InvalidField {
            field: "data",
            reason: err.to_string(),
        })?;
    let boot_id = fields
        .remove("bootId")
        .ok_or(Corruption::MissingField("data.bootId"))?;
    let boot_id: String =
        serde_json::from_str(boot_id.get()).map_err(|err| Corruption::InvalidField {
            field: "data.bootId",
            reason: err.to_string(),
        })?;
    let claims = match fields.remove("claims") {
        None => BTreeMap::new(),
        Some(raw) => decode_claims(raw)?,
    };

    Ok(Contents {
        version,
        boot_id,
        claims,
        data_unknown: to_value_map(fields, "data")?,
        envelope_unknown: to_value_map(envelope, "(top level)")?,
    })
}

fn decode_claims(raw: &RawValue) -> Result<BTreeMap<String, StoredClaim>, Corruption> {
    let invalid = |err: serde_json::Error| Corruption::InvalidField {
        field: "data.claims",
        reason: err.to_string(),
    };
    // A null `claims` (as a Go writer with a nil map would produce) is an empty set.
    let entries: Option<BTreeMap<String, &RawValue>> =
        serde_json::from_str(raw.get()).map_err(invalid)?;
    Ok(entries
        .unwrap_or_default()
        .into_iter()
        .map(|(uid, raw)| {
            let json: Box<str> = raw.get().into();
            let stored = match serde_json::from_str::<ClaimRecord>(&json) {
                Ok(record) => StoredClaim::Known { record, json },
                Err(err) => StoredClaim::Unreadable {
                    json,
                    reason: err.to_string(),
                },
            };
            (uid, stored)
        })
        .collect())
}

fn to_value_map(
    fields: BTreeMap<String, &RawValue>,
    field: &'static str,
) -> Result<Map<String, Value>, Corruption> {
    fields
        .into_iter()
        .map(|(key, raw)| {
            let value =
                serde_json::from_str(raw.get()).map_err(|err| Corruption::InvalidField {
                    field,
                    reason: err.to_string(),
                })?;
            Ok((key, value))
        })
        .collect()
}

fn verify_checksum(recorded: &str, data: &[u8]) -> Result<(), Corruption> {
    let Some(hex) = recorded.strip_prefix(CHECKSUM_PREFIX) else {
        return Err(Corruption::UnknownChecksumAlgorithm(recorded.to_owned()));
    };
    let computed = checksum_of(data);
    if computed[CHECKSUM_PREFIX.len()..].eq_ignore_ascii_case(hex) {
        Ok(())
    } else {
        Err(Corruption::ChecksumMismatch {
            recorded: recorded.to_owned(),
            computed,
        })
    }
}

/// `sha256:<lowercase hex>` of `data`.
fn checksum_of(data: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(CHECKSUM_PREFIX.len() + 64);
    out.push_str(CHECKSUM_PREFIX);
    for byte in digest {
        // Writing into a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advanced::checkpoint::ClaimState;
    use serde_json::json;

    fn sample() -> Contents {
        let mut contents = Contents::empty("boot-1");
        contents.claims.insert(
            "uid-1".into(),
            StoredClaim::from_record(ClaimRecord::started("ns", "claim")).unwrap(),
        );
        contents
            .data_unknown
            .insert("nodeName".into(), json!("node-a"));
        contents
            .envelope_unknown
            .insert("writer".into(), json!({ "sdk": "9.9" }));
        contents
    }

    #[test]
    fn encode_decode_round_trip() {
        let contents = sample();
        let bytes = encode(&contents).unwrap();
        assert_eq!(decode(&bytes).unwrap(), contents);
    }

    #[test]
    fn checksum_covers_data_bytes_exactly() {
        let bytes = encode(&sample()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let envelope: BTreeMap<String, &RawValue> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            envelope["checksum"].get(),
            format!("\"{}\"", checksum_of(envelope["data"].get().as_bytes()))
        );
        // Whitespace inside `data` changes the bytes, so the checksum no longer matches.
        let spaced = text.replacen("\"claims\":", "\"claims\": ", 1);
        assert!(matches!(
            decode(spaced.as_bytes()),
            Err(Corruption::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn unreadable_claim_is_kept_verbatim() {
        let data = r#"{"bootId":"b","claims":{"u":{"devices":"not-a-list"},"v":{"state":"PrepareCompleted"}}}"#;
        let file = format!(
            r#"{{"version":1,"checksum":"{}","data":{data}}}"#,
            checksum_of(data.as_bytes())
        );
        let contents = decode(file.as_bytes()).unwrap();
        assert!(matches!(
            contents.claims["u"],
            StoredClaim::Unreadable { .. }
        ));
        assert_eq!(
            contents.claims["v"].known().unwrap().state,
            ClaimState::PrepareCompleted
        );
        let again = decode(&encode(&contents).unwrap()).unwrap();
        let StoredClaim::Unreadable { json, .. } = &again.claims["u"] else {
            panic!("claim u should stay unreadable");
        };
        assert_eq!(&**json, r#"{"devices":"not-a-list"}"#);
    }

    #[test]
    fn malformed_envelopes_are_classified() {
        fn check(input: &str, expected: impl Fn(&Corruption) -> bool) {
            let err = decode(input.as_bytes()).unwrap_err();
            assert!(expected(&err), "{input:?} gave {err:?}");
        }
        check("", |c| *c == Corruption::Empty);
        check("{\"version\":1", |c| {
            matches!(c, Corruption::InvalidJson(_))
        });
        check("[]", |c| matches!(c, Corruption::InvalidJson(_)));
        check(r#"{"checksum":"sha256:00","data":{}}"#, |c| {
            *c == Corruption::MissingField("version")
        });
        check(r#"{"version":0,"checksum":"sha256:00","data":{}}"#, |c| {
            *c == Corruption::UnsupportedVersion(0)
        });
        check(r#"{"version":1,"checksum":"md5:00","data":{}}"#, |c| {
            matches!(c, Corruption::UnknownChecksumAlgorithm(_))
        });
    }
}
