//! Builds pprof profiles (gzipped `profile.proto`, what `go tool pprof`,
//! Pyroscope and Parca read) from symbolized stacks.
//!
//! ```
//! use tracer::{binary::Frame, formats::pprof::{Label, Location, MappingInfo, ProfileBuilder}};
//!
//! let mut b = ProfileBuilder::new(&[("major_faults", "count"), ("fault_time", "nanoseconds")]);
//! b.mapping(MappingInfo {
//!     start: 0x400000,
//!     limit: 0x800000,
//!     offset: 0,
//!     file: "/usr/local/bin/server".into(),
//!     build_id: "0123abcd".into(),
//! });
//! let leaf = Location {
//!     address: 0x4123a0,
//!     frames: vec![Frame {
//!         function: "runtime.gcStart".into(),
//!         file: "/go/src/runtime/mgc.go".into(),
//!         line: 700,
//!         inlined: false,
//!         start_line: 640,
//!     }],
//! };
//! b.add(&[leaf], &[3, 1_200_000], &[Label::str("in_pause", "true")])?;
//! let gz = b.encode_gzip();
//! let back = tracer::formats::pprof::decode(&gz)?;
//! assert_eq!(back.sample.len(), 1);
//! # Ok::<(), tracer::formats::pprof::ProfileError>(())
//! ```
//!
//! Identical functions, locations and (stack, labels) pairs are stored once:
//! adding the same stack with the same labels again sums its values, so a
//! long-running collector's profile grows with distinct sites, not events.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
};

pub use super::profile_proto as proto;
use crate::binary::Frame;

/// Why a profile could not be built or read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A sample's values do not match the profile's sample types.
    #[error("a sample has {got} values, the profile has {want} sample types")]
    ValueCount { got: usize, want: usize },
    /// The bytes are not a (gzipped) profile.proto.
    #[error("not a pprof profile: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The gzip stream is broken.
    #[error("not a gzip stream: {0}")]
    Gzip(#[from] std::io::Error),
}

/// The address range of one object file, as pprof's `Mapping`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappingInfo {
    /// First address of the range (runtime address if locations are runtime).
    pub start: u64,
    /// One past the last address.
    pub limit: u64,
    /// File offset that `start` maps.
    pub offset: u64,
    /// Path of the object file.
    pub file: String,
    /// The binary's build id (Go's, or the GNU one), "" if none.
    pub build_id: String,
}

/// One address of a stack and the source frames it stands for, innermost
/// (inlined callee) first, as `Symbolizer::symbolize` gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub address: u64,
    pub frames: Vec<Frame>,
}

/// What a label holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelValue {
    Str(String),
    /// A number and its unit ("bytes", "nanoseconds", "" for none).
    Num(i64, String),
}

/// A sample label, e.g. in_pause=true or old_stack=2048 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    pub key: String,
    pub value: LabelValue,
}

impl Label {
    /// A string label.
    pub fn str(key: &str, value: &str) -> Label {
        Label {
            key: key.to_owned(),
            value: LabelValue::Str(value.to_owned()),
        }
    }

    /// A numeric label with a unit ("" for none).
    pub fn num(key: &str, value: i64, unit: &str) -> Label {
        Label {
            key: key.to_owned(),
            value: LabelValue::Num(value, unit.to_owned()),
        }
    }
}

/// A location's identity: (mapping id, address, [(function id, line)]).
type LocationKey = (u64, u64, Vec<(u64, i64)>);

/// Accumulates samples and writes them as one profile.
pub struct ProfileBuilder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    /// (name, file, start line) -> function id.
    functions: HashMap<(i64, i64, i64), u64>,
    locations: HashMap<LocationKey, u64>,
    /// (location ids, labels) -> index into `profile.sample`.
    samples: HashMap<(Vec<u64>, Vec<proto::Label>), usize>,
}

impl ProfileBuilder {
    /// A profile whose samples carry one value per `(type, unit)`, e.g.
    /// `&[("growths", "count"), ("bytes_copied", "bytes")]`. The first type
    /// is the period type (one event per count) until `period` says otherwise.
    pub fn new(sample_types: &[(&str, &str)]) -> ProfileBuilder {
        let mut b = ProfileBuilder {
            profile: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
        };
        b.string("");
        let types: Vec<_> = sample_types
            .iter()
            .map(|(t, u)| b.value_type(t, u))
            .collect();
        b.profile.period_type = types.first().copied();
        b.profile.period = 1;
        b.profile.sample_type = types;
        b
    }

    /// The index of `s` in the string table, added if new.
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, r#type: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(r#type),
            unit: self.string(unit),
        }
    }

    /// Events between samples: `(type, unit)` and how many (e.g. a sampled
    /// stack-growth profile taking one sample per 1000 CPU samples).
    pub fn period(&mut self, period_type: (&str, &str), period: i64) -> &mut Self {
        self.profile.period_type = Some(self.value_type(period_type.0, period_type.1));
        self.profile.period = period;
        self
    }

    /// When collection started (ns since the Unix epoch) and for how long.
    pub fn time(&mut self, time_nanos: i64, duration_nanos: i64) -> &mut Self {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
        self
    }

    /// The sample type pprof shows unless told otherwise (default: the last).
    pub fn default_sample_type(&mut self, r#type: &str) -> &mut Self {
        self.profile.default_sample_type = self.string(r#type);
        self
    }

    /// A free-text comment (`go tool pprof -comments`).
    pub fn comment(&mut self, text: &str) -> &mut Self {
        let i = self.string(text);
        self.profile.comment.push(i);
        self
    }

    /// Adds an object file; locations whose address falls in its range
    /// refer to it. The first one added is the main binary. Returns its id.
    pub fn mapping(&mut self, m: MappingInfo) -> u64 {
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(&m.file);
        let build_id = self.string(&m.build_id);
        // Symbolized here from pclntab: pprof must not symbolize again.
        self.profile.mapping.push(proto::Mapping {
            id,
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.offset,
            filename,
            build_id,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        id
    }

    fn mapping_of(&self, address: u64) -> u64 {
        self.profile
            .mapping
            .iter()
            .find(|m| (m.memory_start..m.memory_limit).contains(&address))
            .map_or(0, |m| m.id)
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let name = self.string(&f.function);
        let file = self.string(&f.file);
        let key = (name, file, i64::from(f.start_line));
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(proto::Function {
            id,
            name,
            // Go's own profiles repeat the name: there is no mangling.
            system_name: name,
            filename: file,
            start_line: key.2,
        });
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, loc: &Location) -> u64 {
        let lines: Vec<(u64, i64)> = loc
            .frames
            .iter()
            .map(|f| (self.function(f), i64::from(f.line)))
            .collect();
        let mapping_id = self.mapping_of(loc.address);
        let key = (mapping_id, loc.address, lines);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address: loc.address,
            line: key
                .2
                .iter()
                .map(|&(function_id, line)| proto::Line {
                    function_id,
                    line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    fn label(&mut self, l: &Label) -> proto::Label {
        let key = self.string(&l.key);
        match &l.value {
            LabelValue::Str(s) => proto::Label {
                key,
                str: self.string(s),
                num: 0,
                num_unit: 0,
            },
            LabelValue::Num(n, unit) => proto::Label {
                key,
                str: 0,
                num: *n,
                num_unit: if unit.is_empty() {
                    0
                } else {
                    self.string(unit)
                },
            },
        }
    }

    /// Adds `values` (one per sample type) for `stack` (leaf first) with
    /// `labels`; a stack already added with the same labels gets its values
    /// summed. An empty stack (the kernel could not read it) is recorded as
    /// one `[unknown]` frame: pprof leaves samples without locations out of
    /// every view, which would hide their values.
    pub fn add(
        &mut self,
        stack: &[Location],
        values: &[i64],
        labels: &[Label],
    ) -> Result<(), ProfileError> {
        let want = self.profile.sample_type.len();
        if values.len() != want {
            return Err(ProfileError::ValueCount {
                got: values.len(),
                want,
            });
        }
        let location_id: Vec<u64> = if stack.is_empty() {
            vec![self.location(&unknown_location())]
        } else {
            stack.iter().map(|l| self.location(l)).collect()
        };
        let mut sorted: Vec<&Label> = labels.iter().collect();
        sorted.sort();
        let label: Vec<proto::Label> = sorted.into_iter().map(|l| self.label(l)).collect();
        let key = (location_id, label);
        if let Some(&i) = self.samples.get(&key) {
            let sample = &mut self.profile.sample[i];
            for (sum, v) in sample.value.iter_mut().zip(values) {
                *sum = sum.saturating_add(*v);
            }
            return Ok(());
        }
        self.samples.insert(key.clone(), self.profile.sample.len());
        self.profile.sample.push(proto::Sample {
            location_id: key.0,
            value: values.to_vec(),
            label: key.1,
        });
        Ok(())
    }

    /// Number of distinct samples so far.
    pub fn len(&self) -> usize {
        self.profile.sample.len()
    }

    /// Has nothing been added?
    pub fn is_empty(&self) -> bool {
        self.profile.sample.is_empty()
    }

    /// The profile as built so far.
    pub fn profile(&self) -> &proto::Profile {
        &self.profile
    }

    /// The serialized profile.proto, not compressed.
    pub fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.profile)
    }

    /// The gzipped profile.proto, as pprof files and `/debug/pprof` serve it.
    pub fn encode_gzip(&self) -> Vec<u8> {
        let raw = self.encode();
        let mut gz = flate2::write::GzEncoder::new(
            Vec::with_capacity(raw.len() / 2),
            flate2::Compression::default(),
        );
        gz.write_all(&raw).expect("writing to a Vec cannot fail");
        gz.finish().expect("writing to a Vec cannot fail")
    }
}

/// The stand-in frame of a sample whose stack is unknown.
pub const UNKNOWN_FUNCTION: &str = "[unknown]";

fn unknown_location() -> Location {
    Location {
        address: 0,
        frames: vec![Frame {
            function: UNKNOWN_FUNCTION.to_owned(),
            file: String::new(),
            line: 0,
            inlined: false,
            start_line: 0,
        }],
    }
}

/// Reads a profile.proto, gzipped (as files are) or not.
pub fn decode(bytes: &[u8]) -> Result<proto::Profile, ProfileError> {
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut out)?;
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    Ok(<proto::Profile as prost::Message>::decode(bytes)?)
}

#[cfg(test)]
#[path = "pprof_tests.rs"]
mod tests;
