//! The initramfs: nasinit as /init, the C libraries it links, and the kernel modules needed to
//! reach the verified root (with their dependencies, uncompressed, in load order), as a
//! reproducible cpio "newc" archive.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// One entry of a newc archive.
pub enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    CharDev { major: u32, minor: u32, mode: u32 },
}

/// A cpio "newc" archive, the format the kernel unpacks. Entries are written sorted, parents
/// first, with zero timestamps and root ownership, so the bytes depend only on the content.
#[derive(Default)]
pub struct Cpio {
    entries: BTreeMap<String, Entry>,
}

impl Cpio {
    pub fn add(&mut self, path: &str, entry: Entry) {
        let path = path.trim_start_matches('/').to_string();
        // Every parent directory gets an entry of its own.
        let mut parent = Path::new(&path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            self.entries.entry(p.display().to_string()).or_insert(Entry::Dir);
            parent = p.parent();
        }
        self.entries.insert(path, entry);
    }

    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut offset = 0usize;
        for (ino, (name, entry)) in (1u32..).zip(self.entries.iter()) {
            let (mode, data, rmaj, rmin): (u32, &[u8], u32, u32) = match entry {
                Entry::Dir => (0o040755, &[], 0, 0),
                Entry::File { data, mode } => (0o100000 | mode, data, 0, 0),
                Entry::CharDev { major, minor, mode } => (0o020000 | mode, &[], *major, *minor),
            };
            offset += header(out, ino, mode, data.len(), rmaj, rmin, name)?;
            out.write_all(data)?;
            offset += data.len();
            offset += pad(out, offset)?;
        }
        offset += header(out, 0, 0, 0, 0, 0, "TRAILER!!!")?;
        pad(out, offset)?;
        Ok(())
    }
}

fn header(
    out: &mut impl Write,
    ino: u32,
    mode: u32,
    size: usize,
    rmaj: u32,
    rmin: u32,
    name: &str,
) -> std::io::Result<usize> {
    let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
    let h = format!(
        "070701{ino:08x}{mode:08x}{uid:08x}{gid:08x}{nlink:08x}{mtime:08x}{size:08x}{maj:08x}{min:08x}{rmaj:08x}{rmin:08x}{namesize:08x}{check:08x}",
        uid = 0,
        gid = 0,
        mtime = 0,
        size = size,
        maj = 0,
        min = 0,
        namesize = name.len() + 1,
        check = 0
    );
    out.write_all(h.as_bytes())?;
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    let written = h.len() + name.len() + 1;
    Ok(written + pad(out, written)?)
}

/// Pads to the 4-byte boundary newc requires; returns the bytes written.
fn pad(out: &mut impl Write, offset: usize) -> std::io::Result<usize> {
    let n = (4 - offset % 4) % 4;
    out.write_all(&[0u8; 3][..n])?;
    Ok(n)
}

/// Modules in load order: every dependency (from the tree's modules.dep) and every soft
/// "pre:" dependency (modules.softdep, through modules.alias: libcrc32c needs a crc32c driver)
/// before its user. Built-in modules are skipped. Names match with `-` and `_` as equals, as
/// modprobe does.
pub fn resolve_modules(tree: &Path, kernel_release: &str, wanted: &[String]) -> anyhow::Result<Vec<String>> {
    let dir = tree.join("usr/lib/modules").join(kernel_release);
    let deps_text = std::fs::read_to_string(dir.join("modules.dep")).context("reading modules.dep")?;
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in deps_text.lines() {
        let Some((path, rest)) = line.split_once(':') else { continue };
        deps.insert(stem(path), (path.to_string(), rest.split_whitespace().map(String::from).collect()));
    }
    let mut soft: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in read("modules.softdep").lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("softdep") {
            continue;
        }
        let Some(m) = w.next() else { continue };
        let pre: Vec<String> =
            w.skip_while(|x| *x != "pre:").skip(1).take_while(|x| !x.ends_with(':')).map(norm).collect();
        soft.entry(norm(m)).or_default().extend(pre);
    }
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in read("modules.alias").lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let ["alias", a, m] = f[..]
            && !a.contains(['*', '?', '['])
        {
            aliases.entry(norm(a)).or_default().push(norm(m));
        }
    }
    let builtin: Vec<String> = read("modules.builtin").lines().map(stem).collect();
    let r = Resolver { deps, soft, aliases, builtin };
    let mut order: Vec<String> = Vec::new();
    for w in wanted {
        r.visit(&norm(w), &mut order, 0, true)?;
    }
    Ok(order)
}

fn norm(s: &str) -> String {
    s.replace('-', "_")
}

fn stem(p: &str) -> String {
    let file = p.rsplit('/').next().unwrap_or(p);
    norm(file.split(".ko").next().unwrap_or(file))
}

struct Resolver {
    deps: BTreeMap<String, (String, Vec<String>)>,
    soft: BTreeMap<String, Vec<String>>,
    aliases: BTreeMap<String, Vec<String>>,
    builtin: Vec<String>,
}

impl Resolver {
    fn visit(&self, name: &str, order: &mut Vec<String>, depth: usize, required: bool) -> anyhow::Result<()> {
        if depth > 64 {
            bail!("module dependencies of {name} are circular");
        }
        if self.builtin.iter().any(|b| b == name) {
            return Ok(());
        }
        let Some((path, needs)) = self.deps.get(name) else {
            if required {
                bail!("kernel module {name} not found in modules.dep");
            }
            return Ok(());
        };
        if order.contains(path) {
            return Ok(());
        }
        for pre in self.soft.get(name).into_iter().flatten() {
            let candidates: Vec<String> = if self.deps.contains_key(pre) {
                vec![pre.clone()]
            } else {
                self.aliases.get(pre).cloned().unwrap_or_default()
            };
            for c in candidates {
                self.visit(&c, order, depth + 1, false)?;
            }
        }
        // modules.dep lists dependencies so that the last one loads first.
        for d in needs.iter().rev() {
            self.visit(&stem(d), order, depth + 1, true)?;
        }
        if !order.contains(path) {
            order.push(path.clone());
        }
        Ok(())
    }
}

/// Reads a module from the tree, decompressed (the initramfs loads it with finit_module).
pub fn module_bytes(tree: &Path, kernel_release: &str, rel: &str) -> anyhow::Result<Vec<u8>> {
    let path = tree.join("usr/lib/modules").join(kernel_release).join(rel);
    if rel.ends_with(".xz") {
        let out = Command::new("xz").arg("-dc").arg(&path).output().context("running xz")?;
        if !out.status.success() {
            bail!("xz -d {} failed", path.display());
        }
        Ok(out.stdout)
    } else if rel.ends_with(".zst") {
        let out = Command::new("zstd").arg("-dc").arg(&path).output().context("running zstd")?;
        if !out.status.success() {
            bail!("zstd -d {} failed", path.display());
        }
        Ok(out.stdout)
    } else {
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }
}

/// The shared libraries a host binary needs (by file name), from ldd.
pub fn needed_libraries(binary: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("ldd").arg(binary).output().context("running ldd")?;
    if !out.status.success() {
        bail!("ldd {} failed", binary.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        let word = line.split_whitespace().find(|w| w.starts_with('/') || w.contains(".so"));
        if let Some(w) = word {
            let name = w.rsplit('/').next().unwrap_or(w);
            if name.contains(".so") && !name.starts_with("linux-vdso") {
                libs.push(name.to_string());
            }
        }
    }
    libs.sort();
    libs.dedup();
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout_is_what_the_kernel_expects() {
        let mut c = Cpio::default();
        c.add("/init", Entry::File { data: b"#!x".to_vec(), mode: 0o755 });
        c.add("/dev/console", Entry::CharDev { major: 5, minor: 1, mode: 0o600 });
        let mut out = Vec::new();
        c.write(&mut out).expect("write");
        assert_eq!(out.len() % 4, 0);
        let text = String::from_utf8_lossy(&out);
        // Parents come first and get their own entries.
        let dev = text.find("dev\0").expect("dev dir");
        let console = text.find("dev/console\0").expect("console");
        assert!(dev < console);
        assert!(text.contains("TRAILER!!!"));
        // The console node: char device 5:1 (mode 020600, rdevmajor 5, rdevminor 1).
        let h = &text[console - 110..console];
        assert!(h.starts_with("070701"));
        assert_eq!(&h[14..22], "00002180");
        assert_eq!(&h[78..86], "00000005");
        assert_eq!(&h[86..94], "00000001");
        // Byte-identical when written again.
        let mut again = Vec::new();
        c.write(&mut again).expect("write");
        assert_eq!(out, again);
    }

    #[test]
    fn modules_resolve_dependencies_first_and_skip_builtins() {
        let tree = std::env::temp_dir().join(format!("nasos-mods-{}", std::process::id()));
        let dir = tree.join("usr/lib/modules/6.1.0");
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/drivers/md/dm-verity.ko.xz: kernel/drivers/md/dm-bufio.ko.xz kernel/lib/reed_solomon.ko.xz\n\
             kernel/drivers/md/dm-bufio.ko.xz: kernel/drivers/md/dm-mod.ko.xz\n\
             kernel/drivers/md/dm-mod.ko.xz:\n\
             kernel/lib/reed_solomon.ko.xz:\n\
             kernel/fs/erofs/erofs.ko.xz: kernel/lib/libcrc32c.ko.xz\n\
             kernel/lib/libcrc32c.ko.xz:\n\
             kernel/crypto/crc32c_generic.ko.xz:\n",
        )
        .expect("dep");
        std::fs::write(dir.join("modules.softdep"), "softdep libcrc32c pre: crc32c\n").expect("softdep");
        std::fs::write(dir.join("modules.alias"), "alias crc32c crc32c_generic\nalias pci:v*d* virtio_pci\n")
            .expect("alias");
        std::fs::write(dir.join("modules.builtin"), "kernel/drivers/block/virtio_blk.ko\n").expect("builtin");
        let order = resolve_modules(
            &tree,
            "6.1.0",
            &["virtio_blk".into(), "dm_mod".into(), "dm-verity".into(), "erofs".into()],
        )
        .expect("resolve");
        assert_eq!(
            order,
            vec![
                "kernel/drivers/md/dm-mod.ko.xz",
                "kernel/lib/reed_solomon.ko.xz",
                "kernel/drivers/md/dm-bufio.ko.xz",
                "kernel/drivers/md/dm-verity.ko.xz",
                "kernel/crypto/crc32c_generic.ko.xz",
                "kernel/lib/libcrc32c.ko.xz",
                "kernel/fs/erofs/erofs.ko.xz",
            ]
        );
        assert!(resolve_modules(&tree, "6.1.0", &["nope".into()]).is_err());
        std::fs::remove_dir_all(&tree).expect("cleanup");
    }
}
