//! Member offsets of kernel structs from the kernel's own BTF
//! (`/sys/kernel/btf/vmlinux`): the pause explanation reads a laggard's
//! on-CPU time of its last stint from its `task_struct`
//! (`se.sum_exec_runtime` minus `se.prev_sum_exec_runtime`). A small reader
//! of the BTF format (header, type section, string section;
//! `Documentation/bpf/btf.rst`): aya keeps its own parser's lookups private.

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

/// The types of a BTF blob, read in place: the blob and where each type's
/// record starts. Names are resolved only on a lookup, so reading the
/// kernel's 5 MB of BTF costs its bytes and 4 bytes a type, all freed with
/// the `Btf` (a parse into owned names and member lists took about 20 MB,
/// which stayed resident in the agent).
pub struct Btf {
    data: Vec<u8>,
    /// Start of the string section in `data`, and its end.
    strings: (usize, usize),
    /// Where each type's record starts in `data`, by id (id 0 is void).
    at: Vec<u32>,
}

/// One type's record as read: kind, name, size-or-type, and where its
/// members are (structs/unions).
struct Type<'a> {
    kind: u32,
    name: &'a [u8],
    size_or_type: u32,
    vlen: usize,
    bitfields: bool,
    members_at: usize,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// Read a little-endian BTF blob.
    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        let magic = u16::from_le_bytes(data.get(0..2).ok_or(BtfError::Header)?.try_into().unwrap());
        let hdr_len = u32_at(&data, 4).ok_or(BtfError::Header)? as usize;
        let field = |at| {
            u32_at(&data, at)
                .map(|v| v as usize)
                .ok_or(BtfError::Header)
        };
        let (type_off, type_len, str_off, str_len) =
            (field(8)?, field(12)?, field(16)?, field(20)?);
        if magic != MAGIC {
            return Err(BtfError::Header);
        }
        let section = |off: usize, len: usize| {
            let start = hdr_len + off;
            (start + len <= data.len())
                .then_some((start, start + len))
                .ok_or(BtfError::Header)
        };
        let (types, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut at = vec![0u32];
        let mut pos = types.0;
        while pos < types.1 {
            let id = at.len() as u32;
            let bad = || BtfError::Type(id);
            let info = u32_at(&data[..types.1], pos + 4).ok_or_else(bad)?;
            u32_at(&data[..types.1], pos + 8).ok_or_else(bad)?;
            at.push(u32::try_from(pos).map_err(|_| bad())?);
            let vlen = (info & 0xffff) as usize;
            pos += 12
                + match (info >> 24) & 0x1f {
                    1 | 14 | 17 => 4, // int, var, decl tag
                    3 => 12,          // array
                    KIND_STRUCT | KIND_UNION => vlen * 12,
                    6 | 13 => vlen * 8,        // enum, func proto
                    15 | 19 => vlen * 12,      // datasec, enum64
                    2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef.., func, float, type tag
                    _ => return Err(bad()),
                };
            if pos > types.1 {
                return Err(bad());
            }
        }
        Ok(Btf { data, strings, at })
    }

    /// The running kernel's BTF.
    pub fn vmlinux() -> anyhow::Result<Btf> {
        Ok(Btf::parse(std::fs::read(VMLINUX)?)?)
    }

    /// The name at offset `off` of the string section.
    fn name(&self, off: u32) -> &[u8] {
        self.data[self.strings.0..self.strings.1]
            .get(off as usize..)
            .and_then(|s| s.split(|&c| c == 0).next())
            .unwrap_or_default()
    }

    /// Type `id`'s record (its bounds were checked by `parse`).
    fn ty(&self, id: u32) -> Option<Type<'_>> {
        let pos = *self.at.get(id as usize)? as usize;
        if id == 0 {
            return None;
        }
        let info = u32_at(&self.data, pos + 4)?;
        Some(Type {
            kind: (info >> 24) & 0x1f,
            name: self.name(u32_at(&self.data, pos)?),
            size_or_type: u32_at(&self.data, pos + 8)?,
            vlen: (info & 0xffff) as usize,
            bitfields: info >> 31 != 0,
            members_at: pos + 12,
        })
    }

    /// A struct's or union's members: (name, type, bit offset).
    fn members<'a>(&'a self, t: &Type<'a>) -> impl Iterator<Item = (&'a [u8], u32, u32)> + 'a {
        let (n, at, bitfields) = match t.kind {
            KIND_STRUCT | KIND_UNION => (t.vlen, t.members_at, t.bitfields),
            _ => (0, 0, false),
        };
        (0..n).filter_map(move |i| {
            let m = at + i * 12;
            let off = u32_at(&self.data, m + 8)?;
            Some((
                self.name(u32_at(&self.data, m)?),
                u32_at(&self.data, m + 4)?,
                if bitfields { off & 0xff_ffff } else { off },
            ))
        })
    }

    /// The named struct or union `name` (the first of that name).
    fn named(&self, name: &str) -> Option<Type<'_>> {
        (1..self.at.len() as u32)
            .filter_map(|id| self.ty(id))
            .find(|t| matches!(t.kind, KIND_STRUCT | KIND_UNION) && t.name == name.as_bytes())
    }

    /// The struct a type id names, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<Type<'_>> {
        for _ in 0..16 {
            let t = self.ty(id)?;
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
        let mut t = self.named(name).ok_or_else(missing)?;
        let mut bits = 0;
        for member in path {
            let (off, ty) = self.find(&t, member.as_bytes()).ok_or_else(missing)?;
            bits += off;
            t = self.resolve(ty).ok_or_else(missing)?;
        }
        Ok(bits / 8)
    }

    /// Size in bytes of struct `name`.
    pub fn size(&self, name: &str) -> Result<u32, BtfError> {
        self.named(name)
            .filter(|t| t.kind == KIND_STRUCT)
            .map(|t| t.size_or_type)
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))
    }

    /// A member's bit offset and type, looking into anonymous members.
    fn find(&self, t: &Type<'_>, member: &[u8]) -> Option<(u32, u32)> {
        for (n, ty, off) in self.members(t) {
            if n == member {
                return Some((off, ty));
            }
            if n.is_empty()
                && let Some(inner) = self.resolve(ty)
                && let Some((o, ty)) = self.find(&inner, member)
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
        let btf = Btf::parse(blob()).unwrap();
        assert_eq!(btf.offset("b", &["y"]), Ok(8));
        assert_eq!(btf.offset("a", &["inner", "y"]), Ok(16));
        assert!(matches!(btf.offset("a", &["z"]), Err(BtfError::Missing(_))));
        assert_eq!(Btf::parse(vec![0u8; 30]).err(), Some(BtfError::Header));
    }
}
