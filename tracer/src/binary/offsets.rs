//! Byte offsets of the Go runtime struct fields the probes read, and where
//! each came from. This first source is the per-version table measured on
//! real builds (see GO_RUNTIME.md); DWARF and the runtime's own type
//! descriptors take precedence where a binary has them.

use tracer_common::process::GoOffsets;

use super::GoVersion;

/// Where an offset value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetSource {
    Dwarf,
    TypeDescriptors,
    VersionTable,
}

/// One field offset and its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Offset {
    pub value: u16,
    pub source: OffsetSource,
}

/// Member offsets by struct (`runtime.g`) and member (`sched`), as DWARF
/// or the type descriptors give them.
pub(crate) type StructLayouts =
    std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, u64>>;

/// The offsets gostw needs, by field name (`g.stack.lo`, `m.curg`, ...).
/// Serialized as `{name: {value, source}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct StructOffsets {
    pub fields: std::collections::BTreeMap<&'static str, Offset>,
}

/// Field names, in the order of `GoOffsets`.
pub const FIELDS: &[&str] = &[
    "g.stack.lo",
    "g.stack.hi",
    "g.stackguard0",
    "g.m",
    "g.sched.sp",
    "g.sched.pc",
    "g.sched.bp",
    "g.goid",
    "m.morebuf.pc",
    "m.procid",
    "m.curg",
    "m.preemptoff",
    STACK_SLOT,
    "g.atomicstatus",
    "m.g0",
];

/// The one entry of `FIELDS` that is a stack slot, not a struct member.
pub const STACK_SLOT: &str = "startTheWorldWithSema.ret.rsp_minus.startedStopping";

/// The fields that are runtime struct members (all but the stack slot),
/// which DWARF and the type descriptors can give.
pub fn struct_fields() -> impl Iterator<Item = &'static str> {
    FIELDS.iter().copied().filter(|f| *f != STACK_SLOT)
}

impl StructOffsets {
    /// The per-version table; `None` for a version outside it.
    pub fn from_version_table(v: GoVersion) -> Option<StructOffsets> {
        if v.major != 1 || !(19..=27).contains(&v.minor) {
            return None;
        }
        let m = v.minor;
        let (sched_bp, goid, procid, curg, preemptoff) = match m {
            19..=22 => (104, 152, 72, 192, 248),
            23..=24 => (104, 160, 72, 192, 248),
            25 => (96, 152, 64, 184, 240),
            _ => (96, 152, 64, 184, 248),
        };
        let mut fields = std::collections::BTreeMap::new();
        let mut put = |name: &'static str, value: u16| {
            fields.insert(
                name,
                Offset {
                    value,
                    source: OffsetSource::VersionTable,
                },
            );
        };
        put("g.stack.lo", 0);
        put("g.stack.hi", 8);
        put("g.stackguard0", 16);
        put("g.m", 48);
        put("g.sched.sp", 56);
        put("g.sched.pc", 64);
        put("g.sched.bp", sched_bp);
        put("g.goid", goid);
        // atomicstatus and stackLock (4 bytes each) sit right before goid in
        // every version of the table.
        put("g.atomicstatus", goid - 8);
        put("m.g0", 0);
        put("m.morebuf.pc", 16);
        put("m.procid", procid);
        put("m.curg", curg);
        put("m.preemptoff", preemptoff);
        // Go 1.22+ keeps w.startedStopping 48 bytes below the stack pointer
        // at the RET of startTheWorldWithSema (measured with `go tool
        // objdump` on amd64 and arm64 builds of 1.22-1.27: on arm64 the
        // frame drops 112 bytes and the slot is 64(RSP) in the body).
        if m >= 22 {
            put(STACK_SLOT, 48);
        }
        Some(StructOffsets { fields })
    }

    /// Offsets computed from struct layouts (nested fields add up).
    pub(crate) fn from_layouts(layouts: &StructLayouts, source: OffsetSource) -> StructOffsets {
        let get = |s: &str, f: &str| layouts.get(s)?.get(f).copied();
        let sum = |a: Option<u64>, b: Option<u64>| a?.checked_add(b?);
        let values = [
            (
                "g.stack.lo",
                sum(get("runtime.g", "stack"), get("runtime.stack", "lo")),
            ),
            (
                "g.stack.hi",
                sum(get("runtime.g", "stack"), get("runtime.stack", "hi")),
            ),
            ("g.stackguard0", get("runtime.g", "stackguard0")),
            ("g.m", get("runtime.g", "m")),
            (
                "g.sched.sp",
                sum(get("runtime.g", "sched"), get("runtime.gobuf", "sp")),
            ),
            (
                "g.sched.pc",
                sum(get("runtime.g", "sched"), get("runtime.gobuf", "pc")),
            ),
            (
                "g.sched.bp",
                sum(get("runtime.g", "sched"), get("runtime.gobuf", "bp")),
            ),
            ("g.goid", get("runtime.g", "goid")),
            (
                "m.morebuf.pc",
                sum(get("runtime.m", "morebuf"), get("runtime.gobuf", "pc")),
            ),
            ("m.procid", get("runtime.m", "procid")),
            ("m.curg", get("runtime.m", "curg")),
            ("m.preemptoff", get("runtime.m", "preemptoff")),
            ("g.atomicstatus", get("runtime.g", "atomicstatus")),
            ("m.g0", get("runtime.m", "g0")),
            // Optional (not in `FIELDS`): the pause explanation's M walk.
            ("m.alllink", get("runtime.m", "alllink")),
            ("m.p", get("runtime.m", "p")),
        ];
        let fields = values
            .into_iter()
            .filter_map(|(name, v)| {
                let value = u16::try_from(v?)
                    .ok()
                    .filter(|&v| v != GoOffsets::UNKNOWN)?;
                Some((name, Offset { value, source }))
            })
            .collect();
        StructOffsets { fields }
    }

    /// These offsets, with the fields they lack taken from `other`.
    pub fn or(mut self, other: &StructOffsets) -> StructOffsets {
        for (name, offset) in &other.fields {
            self.fields.entry(name).or_insert(*offset);
        }
        self
    }

    /// Struct fields (`struct_fields()`) with no value.
    pub fn missing_struct_fields(&self) -> Vec<&'static str> {
        struct_fields()
            .filter(|f| !self.fields.contains_key(f))
            .collect()
    }

    /// The offset of `name`, if known.
    pub fn get(&self, name: &str) -> Option<u16> {
        self.fields.get(name).map(|o| o.value)
    }

    /// The form the kernel programs take; unknown fields are `GoOffsets::UNKNOWN`.
    pub fn to_kernel(&self) -> GoOffsets {
        let g = |name| self.get(name).unwrap_or(GoOffsets::UNKNOWN);
        GoOffsets {
            g_stack_lo: g("g.stack.lo"),
            g_stack_hi: g("g.stack.hi"),
            g_stackguard0: g("g.stackguard0"),
            g_m: g("g.m"),
            g_sched_sp: g("g.sched.sp"),
            g_sched_pc: g("g.sched.pc"),
            g_sched_bp: g("g.sched.bp"),
            g_goid: g("g.goid"),
            m_morebuf_pc: g("m.morebuf.pc"),
            m_procid: g("m.procid"),
            m_curg: g("m.curg"),
            m_preemptoff: g("m.preemptoff"),
            start_rsp_started_stopping: g(STACK_SLOT),
            g_atomicstatus: g("g.atomicstatus"),
            m_g0: g("m.g0"),
            start_call_rsp_started_stopping: GoOffsets::UNKNOWN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> GoVersion {
        GoVersion {
            major: 1,
            minor,
            patch: 0,
        }
    }

    #[test]
    fn table_matches_measured_layouts() {
        let t = StructOffsets::from_version_table(v(25)).unwrap();
        assert_eq!(t.get("m.preemptoff"), Some(240));
        assert_eq!(t.get("g.sched.bp"), Some(96));
        let t = StructOffsets::from_version_table(v(23)).unwrap();
        assert_eq!(t.get("g.goid"), Some(160));
        assert_eq!(t.get("g.atomicstatus"), Some(152));
        assert_eq!(
            StructOffsets::from_version_table(v(19))
                .unwrap()
                .get(STACK_SLOT),
            None
        );
        assert!(StructOffsets::from_version_table(v(30)).is_none());
    }

    #[test]
    fn unknown_fields_become_the_kernel_sentinel() {
        let k = StructOffsets::default().to_kernel();
        assert_eq!(k.m_curg, GoOffsets::UNKNOWN);
    }
}
