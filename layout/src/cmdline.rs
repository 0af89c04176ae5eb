//! The kernel command line that the UKI carries and the initramfs reads: how to open the verified
//! root. The root partition itself is named by nothing but its verity root hash (see
//! [`crate::slot::root_partuuid`]), so a UKI fits whichever slot holds its root.
//!
//! `nasos.verity=ROOTHASH:SALT:DATABLOCKS:HASHOFFSET [nasos.init=PATH]`

use std::fmt;

const VERITY: &str = "nasos.verity=";
const INIT: &str = "nasos.init=";

/// dm-verity parameters of a root filesystem whose hash tree follows its data in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verity {
    /// Hex, as veritysetup prints it.
    pub root_hash: String,
    /// Hex.
    pub salt: String,
    /// 4 KiB data blocks.
    pub data_blocks: u64,
    /// Byte offset of the hash tree in the partition (= the data's size).
    pub hash_offset: u64,
}

/// What the kernel command line tells the initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootArgs {
    pub verity: Verity,
    /// The program to exec in the new root instead of nasinit (development and rescue).
    pub init: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    #[error("no {VERITY}… on the kernel command line: this kernel was not started from a nasos UKI")]
    NoVerity,
    #[error("{VERITY}{0} is not ROOTHASH:SALT:DATABLOCKS:HASHOFFSET")]
    Shape(String),
    #[error("{VERITY}: the root hash and the salt must be hex digits, the root hash at least 32 of them")]
    NotHex,
    #[error("{VERITY}: {0} is not a number")]
    NotNumber(String),
}

impl Verity {
    /// The one argument carrying these parameters.
    pub fn to_arg(&self) -> String {
        format!("{VERITY}{}:{}:{}:{}", self.root_hash, self.salt, self.data_blocks, self.hash_offset)
    }

    /// Parses the value of `nasos.verity=` (without the key).
    pub fn parse_value(value: &str) -> Result<Verity, CmdlineError> {
        let f: Vec<&str> = value.split(':').collect();
        let [root_hash, salt, blocks, offset] = f[..] else {
            return Err(CmdlineError::Shape(value.to_string()));
        };
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit());
        if !hex(root_hash) || root_hash.len() < 32 || !hex(salt) {
            return Err(CmdlineError::NotHex);
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| CmdlineError::NotNumber(s.to_string()));
        Ok(Verity {
            root_hash: root_hash.to_ascii_lowercase(),
            salt: salt.to_ascii_lowercase(),
            data_blocks: num(blocks)?,
            hash_offset: num(offset)?,
        })
    }
}

impl RootArgs {
    /// The arguments to append to the kernel command line.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec![self.verity.to_arg()];
        if let Some(init) = &self.init {
            out.push(format!("{INIT}{init}"));
        }
        out
    }

    /// Reads them back from a whole kernel command line (`/proc/cmdline`). Other arguments are
    /// left alone; when a key repeats, the last one counts, as it does for the kernel.
    pub fn parse(cmdline: &str) -> Result<RootArgs, CmdlineError> {
        let last = |k: &str| cmdline.split_whitespace().filter_map(|w| w.strip_prefix(k)).next_back();
        let verity = Verity::parse_value(last(VERITY).ok_or(CmdlineError::NoVerity)?)?;
        let init = last(INIT).filter(|s| !s.is_empty()).map(str::to_string);
        Ok(RootArgs { verity, init })
    }
}

impl RootArgs {
    /// The program to run in the new root. The override is taken only on a development image:
    /// on any other, whoever can edit the boot loader's line (Secure Boot off, or a loader that
    /// passes one) must not be able to swap the appliance for a shell. Says why when it ignores one.
    pub fn init_program<'a>(&'a self, development: bool, default: &'a str) -> (&'a str, Option<String>) {
        match &self.init {
            Some(init) if development => (init, None),
            Some(init) => (
                default,
                Some(format!("{INIT}{init} ignored: only a development image runs another init than {default}")),
            ),
            None => (default, None),
        }
    }
}

impl fmt::Display for RootArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_args().join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Verity {
        Verity { root_hash: "ab".repeat(32), salt: "cd".repeat(32), data_blocks: 28_160, hash_offset: 115_343_360 }
    }

    #[test]
    fn reads_its_arguments_among_others() {
        let a = RootArgs { verity: sample(), init: None };
        let line = format!("console=ttyS0,115200 {} quiet loglevel=4", a);
        assert_eq!(RootArgs::parse(&line), Ok(a));
    }

    #[test]
    fn init_override_is_carried() {
        let a = RootArgs { verity: sample(), init: Some("/bin/sh".into()) };
        assert_eq!(RootArgs::parse(&a.to_string()).expect("parses").init.as_deref(), Some("/bin/sh"));
    }

    #[test]
    fn only_a_development_image_takes_another_init() {
        let a = RootArgs { verity: sample(), init: Some("/bin/sh".into()) };
        assert_eq!(a.init_program(true, "/usr/sbin/nasinit"), ("/bin/sh", None));
        let (init, note) = a.init_program(false, "/usr/sbin/nasinit");
        assert_eq!(init, "/usr/sbin/nasinit");
        assert!(note.is_some_and(|n| n.contains("nasos.init=/bin/sh ignored")));
        let plain = RootArgs { verity: sample(), init: None };
        assert_eq!(plain.init_program(false, "/usr/sbin/nasinit"), ("/usr/sbin/nasinit", None));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert_eq!(RootArgs::parse("console=ttyS0"), Err(CmdlineError::NoVerity));
        assert_eq!(RootArgs::parse("nasos.verity=a:b:1"), Err(CmdlineError::Shape("a:b:1".into())));
        assert_eq!(RootArgs::parse("nasos.verity=zz:bb:1:2"), Err(CmdlineError::NotHex));
        let short = format!("nasos.verity={}:bb:1:2", "a".repeat(31));
        assert_eq!(RootArgs::parse(&short), Err(CmdlineError::NotHex));
        let line = format!("nasos.verity={}:bb:x:2", "a".repeat(64));
        assert_eq!(RootArgs::parse(&line), Err(CmdlineError::NotNumber("x".into())));
        assert!(CmdlineError::NoVerity.to_string().contains("nasos.verity="));
    }

    proptest! {
        #[test]
        fn round_trips(hash in "[0-9a-f]{32,128}", salt in "[0-9a-f]{1,128}", blocks: u64, offset: u64,
                       init in proptest::option::of("/[a-z/]{1,20}"), before in "[a-z=]{0,20}") {
            let a = RootArgs { verity: Verity { root_hash: hash, salt, data_blocks: blocks, hash_offset: offset }, init };
            let line = format!("{before} {a} ro");
            prop_assert_eq!(RootArgs::parse(&line), Ok(a));
        }

        #[test]
        fn never_panics(line in ".{0,200}") {
            let _ = RootArgs::parse(&line);
        }
    }
}
