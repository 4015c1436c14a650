//! Member offsets of kernel structs from the kernel's own BTF
//! (`/sys/kernel/btf/vmlinux`): the pause explanation reads a laggard's
//! on-CPU time of its last stint from its `task_struct`
//! (`se.sum_exec_runtime` minus `se.prev_sum_exec_runtime`). A small reader
//! of the BTF format (header, type section, string section;
//! `Documentation/bpf/btf.rst`): aya keeps its own parser's lookups private.

use std::collections::HashMap;

/// Where the kernel's BTF is.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
/// Kinds that only qualify the type they point to.
const QUALIFIERS: &[u32] = &[
    8,  /* typedef */
    9,  /* volatile */
    10, /* const */
    11, /* restrict */
    18, /* type tag */
];

/// Why BTF could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF (bad magic or header)")]
    Header,
    #[error("BTF type {0} is truncated or of an unknown kind")]
    Type(u32),
    #[error("{0} not found in the kernel's BTF")]
    Missing(String),
}

/// One type: kind, name, size-or-type, and its members (structs/unions).
struct Type {
    kind: u32,
    name: String,
    size_or_type: u32,
    /// (name, member type, offset in bits).
    members: Vec<(String, u32, u32)>,
}

/// The types of a BTF blob, by id (id 0 is void).
pub struct Btf {
    types: Vec<Type>,
    by_name: HashMap<String, u32>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// Parse a little-endian BTF blob.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        let magic = u16::from_le_bytes(data.get(0..2).ok_or(BtfError::Header)?.try_into().unwrap());
        let hdr_len = u32_at(data, 4).ok_or(BtfError::Header)? as usize;
        let field = |at| u32_at(data, at).map(|v| v as usize).ok_or(BtfError::Header);
        let (type_off, type_len, str_off, str_len) =
            (field(8)?, field(12)?, field(16)?, field(20)?);
        if magic != MAGIC {
            return Err(BtfError::Header);
        }
        let section = |off: usize, len: usize| {
            data.get(hdr_len + off..hdr_len + off + len)
                .ok_or(BtfError::Header)
        };
        let (types_b, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let name = |off: u32| -> String {
            strings
                .get(off as usize..)
                .and_then(|s| s.split(|&c| c == 0).next())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default()
        };
        let mut types = vec![Type {
            kind: 0,
            name: String::new(),
            size_or_type: 0,
            members: Vec::new(),
        }];
        let mut at = 0;
        while at < types_b.len() {
            let id = types.len() as u32;
            let bad = || BtfError::Type(id);
            let (name_off, info, size_or_type) = (
                u32_at(types_b, at).ok_or_else(bad)?,
                u32_at(types_b, at + 4).ok_or_else(bad)?,
                u32_at(types_b, at + 8).ok_or_else(bad)?,
            );
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let bitfields = info >> 31 != 0;
            let mut members = Vec::new();
            at += match kind {
                1 | 14 | 17 => 4, // int, var, decl tag
                3 => 12,          // array
                4 | 5 => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let off = u32_at(types_b, m + 8).ok_or_else(bad)?;
                        members.push((
                            name(u32_at(types_b, m).ok_or_else(bad)?),
                            u32_at(types_b, m + 4).ok_or_else(bad)?,
                            if bitfields { off & 0xff_ffff } else { off },
                        ));
                    }
                    vlen * 12
                }
                6 | 13 => vlen * 8,        // enum, func proto
                15 | 19 => vlen * 12,      // datasec, enum64
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef.., func, float, type tag
                _ => return Err(bad()),
            };
            types.push(Type {
                kind,
                name: name(name_off),
                size_or_type,
                members,
            });
        }
        let by_name = types
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(t.kind, KIND_STRUCT | KIND_UNION) && !t.name.is_empty())
            .map(|(i, t)| (t.name.clone(), i as u32))
            .collect();
        Ok(Btf { types, by_name })
    }

    /// The running kernel's BTF.
    pub fn vmlinux() -> anyhow::Result<Btf> {
        let data = std::fs::read(VMLINUX)?;
        Ok(Btf::parse(&data)?)
    }

    /// The struct a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..16 {
            let t = self.types.get(id as usize)?;
            if QUALIFIERS.contains(&t.kind) {
                id = t.size_or_type;
                continue;
            }
            return Some(t);
        }
        None
    }

    /// Byte offset of `path` (e.g. `["se", "sum_exec_runtime"]`) inside
    /// struct `name`, through nested structs (and anonymous members).
    pub fn offset(&self, name: &str, path: &[&str]) -> Result<u32, BtfError> {
        let missing = || BtfError::Missing(format!("{name}.{}", path.join(".")));
        let mut t = self
            .by_name
            .get(name)
            .and_then(|&id| self.types.get(id as usize))
            .ok_or_else(missing)?;
        let mut bits = 0;
        for member in path {
            let (off, ty) = self.find(t, member).ok_or_else(missing)?;
            bits += off;
            t = self.resolve(ty).ok_or_else(missing)?;
        }
        Ok(bits / 8)
    }

    /// Size in bytes of struct `name`.
    pub fn size(&self, name: &str) -> Result<u32, BtfError> {
        self.by_name
            .get(name)
            .and_then(|&id| self.types.get(id as usize))
            .filter(|t| t.kind == KIND_STRUCT)
            .map(|t| t.size_or_type)
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))
    }

    /// A member's bit offset and type, looking into anonymous members.
    fn find(&self, t: &Type, member: &str) -> Option<(u32, u32)> {
        for (n, ty, off) in &t.members {
            if n == member {
                return Some((*off, *ty));
            }
            if n.is_empty()
                && let Some(inner) = self.resolve(*ty)
                && let Some((o, ty)) = self.find(inner, member)
            {
                return Some((off + o, ty));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with `struct b { u64 x; u64 y; }` and `struct a { int i;
    /// union { struct b inner; }; }` (an anonymous member).
    fn blob() -> Vec<u8> {
        let strings = b"\0a\0b\0i\0inner\0x\0y\0int\0".to_vec();
        let s = |name: &str| {
            let hay = std::str::from_utf8(&strings).unwrap();
            hay.find(&format!("\0{name}\0")).unwrap() as u32 + 1
        };
        let mut t = Vec::new();
        let mut ty = |name_off: u32, info: u32, size: u32, extra: &[u32]| {
            for v in [name_off, info, size].iter().chain(extra) {
                t.extend_from_slice(&v.to_le_bytes());
            }
        };
        // 1: int
        ty(s("int"), 1 << 24, 8, &[64]);
        // 2: struct b { x: 1 @0, y: 1 @64 }
        ty(s("b"), (4 << 24) | 2, 16, &[s("x"), 1, 0, s("y"), 1, 64]);
        // 3: union { inner: 2 @0 }
        ty(0, (5 << 24) | 1, 16, &[s("inner"), 2, 0]);
        // 4: typedef of 3
        ty(0, 8 << 24, 3, &[]);
        // 5: struct a { i: 1 @0, <anon>: 4 @64 }
        ty(s("a"), (4 << 24) | 2, 24, &[s("i"), 1, 0, 0, 4, 64]);
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn nested_and_anonymous_members_add_up() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.offset("b", &["y"]), Ok(8));
        assert_eq!(btf.offset("a", &["inner", "y"]), Ok(16));
        assert!(matches!(btf.offset("a", &["z"]), Err(BtfError::Missing(_))));
        assert_eq!(Btf::parse(&[0u8; 30]).err(), Some(BtfError::Header));
    }
}
