//! Semantic validation: everything the schema cannot say (names that must exist on the board,
//! widths a vdev type allows, CIDRs, cross references). Runs on the typed model; every finding is
//! located through the document it came from.

use std::collections::{BTreeMap, HashMap};

use ipnet::IpNet;

use crate::board::{Board, DeviceMatch, Port};
use crate::diag::{Diagnostic, Severity, did_you_mean};
use crate::recipe::{Recipe, RootLogin};
use crate::source::{Document, Path};
use crate::units::parse_size;

struct Checker<'d, 'a> {
    doc: &'d Document<'a>,
    out: Vec<Diagnostic>,
}

impl Checker<'_, '_> {
    fn error(&mut self, path: &Path, msg: impl Into<String>, help: impl Into<Option<String>>) {
        let span = self.doc.span_of(path);
        self.out.push(self.doc.diag(Severity::Error, span, msg.into(), help.into()));
    }

    fn warn(&mut self, path: &Path, msg: impl Into<String>, help: impl Into<Option<String>>) {
        let span = self.doc.span_of(path);
        self.out.push(self.doc.diag(Severity::Warning, span, msg.into(), help.into()));
    }

    /// Reports the second and later uses of a name. `what` says what the name is ("link name").
    fn unique<S: AsRef<str>>(&mut self, what: &str, items: impl IntoIterator<Item = (S, Path)>) {
        let mut seen: HashMap<String, Path> = HashMap::new();
        for (name, path) in items {
            let name = name.as_ref();
            if let Some(first) = seen.get(name) {
                let (line, _) = self.doc.file.line_col(self.doc.span_of(first).start);
                self.error(
                    &path,
                    format!("duplicate {what} `{name}`"),
                    format!("it is already used on line {line}; each {what} must be unique"),
                );
            } else {
                seen.insert(name.to_string(), path);
            }
        }
    }

    /// Reports a reference to a name that does not exist, with the closest existing name.
    fn unknown(&mut self, path: &Path, what: &str, name: &str, known: &[&str], whence: &str) {
        let help = match did_you_mean(name, known.iter().copied()) {
            Some(m) => format!("did you mean `{m}`?"),
            None if known.is_empty() => format!("{whence} defines none"),
            None => format!("{whence} defines: {}", known.join(", ")),
        };
        self.error(path, format!("unknown {what} `{name}`"), help);
    }

    fn name(&mut self, path: &Path, what: &str, name: &str, ok: fn(&str) -> bool, rule: &str) {
        if !ok(name) {
            self.error(path, format!("invalid {what} `{name}`"), rule.to_string());
        }
    }
}

/// Validates a recipe against its board.
pub fn recipe(doc: &Document<'_>, r: &Recipe, board: &Board) -> Vec<Diagnostic> {
    let mut c = Checker { doc, out: Vec::new() };
    let root = Path::root();
    image(&mut c, r);
    packages(&mut c, &root.key("packages").key("extra"), &r.packages.extra);
    for (i, m) in r.kernel.modules.iter().enumerate() {
        c.name(
            &root.key("kernel").key("modules").index(i),
            "module name",
            m,
            is_module,
            "module names are letters, digits, `_` and `-`",
        );
    }
    console(&mut c, r);
    let ports = links(&mut c, r, board);
    fabric(&mut c, r, &ports);
    zfs(&mut c, r);
    pools(&mut c, r, board);
    datasets(&mut c, r);
    nfs(&mut c, r);
    c.out
}

fn image(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("image");
    c.name(
        &p.key("name"),
        "image name",
        &r.image.name,
        is_slug,
        "use lowercase letters, digits and dashes, starting with a letter (at most 63)",
    );
    if !is_version(&r.image.version) {
        c.error(
            &p.key("version"),
            format!("invalid version `{}`", r.image.version),
            "write it as MAJOR.MINOR.PATCH, e.g. \"1.4.2\"".to_string(),
        );
    }
    if let Some(h) = &r.image.hostname {
        c.name(
            &p.key("hostname"),
            "hostname",
            h,
            is_hostname,
            "a hostname is 1–63 letters, digits and dashes, not starting or ending with a dash",
        );
    }
}

fn packages(c: &mut Checker<'_, '_>, path: &Path, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        c.name(
            &path.index(i),
            "Debian package name",
            name,
            is_package,
            "package names are lowercase letters, digits and + - . (at least 2 characters)",
        );
    }
    c.unique("package", names.iter().enumerate().map(|(i, n)| (n.as_str(), path.index(i))));
}

fn console(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("console");
    let dev = r.image.development;
    match r.console.root_login {
        RootLogin::Autologin if !dev => c.error(
            &p.key("root_login"),
            "root autologin on a production image",
            "autologin is only for development images: set `development = true` in [image], or use root_login = \"password\" with a root_password_hash".to_string(),
        ),
        RootLogin::Password => match &r.console.root_password_hash {
            None => c.error(
                &p.key("root_login"),
                "password login without `root_password_hash`: the console would not be secured",
                "add root_password_hash = \"$y$…\" (make one with `mkpasswd -m yescrypt`), or set root_login = \"locked\"".to_string(),
            ),
            Some(h) => {
                if let Err(why) = check_crypt_hash(h) {
                    c.error(&p.key("root_password_hash"), why, "make one with `mkpasswd -m yescrypt` or `openssl passwd -6`".to_string());
                }
            }
        },
        RootLogin::Locked | RootLogin::Autologin => {
            if r.console.root_password_hash.is_some() {
                c.warn(
                    &p.key("root_password_hash"),
                    "root_password_hash is ignored unless root_login = \"password\"",
                    None,
                );
            }
        }
    }
}

/// Checks the network links and returns, for each link name, its board port.
fn links<'b>(c: &mut Checker<'_, '_>, r: &Recipe, board: &'b Board) -> HashMap<String, &'b Port> {
    let base = Path::root().key("network").key("links");
    let port_names: Vec<&str> = board.ports.iter().map(|p| p.name.as_str()).collect();
    let mut by_link = HashMap::new();
    c.unique(
        "link name",
        r.network.links.iter().enumerate().map(|(i, l)| (l.name.as_str(), base.index(i).key("name"))),
    );
    c.unique("port", r.network.links.iter().enumerate().map(|(i, l)| (l.port.as_str(), base.index(i).key("port"))));
    let mut addrs: Vec<(String, Path)> = Vec::new();
    for (i, link) in r.network.links.iter().enumerate() {
        let lp = base.index(i);
        c.name(
            &lp.key("name"),
            "interface name",
            &link.name,
            is_ifname,
            "interface names are 1–15 letters, digits, `-` and `_`, starting with a letter",
        );
        match board.ports.iter().find(|p| p.name == link.port) {
            None => {
                c.unknown(&lp.key("port"), "port", &link.port, &port_names, &format!("board `{}`", board.board.name))
            }
            Some(port) => {
                if link.mtu > port.max_mtu {
                    c.error(
                        &lp.key("mtu"),
                        format!("MTU {} is more than port `{}` takes ({})", link.mtu, port.name, port.max_mtu),
                        format!("use at most {}", port.max_mtu),
                    );
                }
                by_link.insert(link.name.clone(), port);
            }
        }
        cidrs(c, &lp.key("addresses"), &link.addresses, &mut addrs);
        c.unique(
            "VLAN id",
            link.vlans.iter().enumerate().map(|(j, v)| (v.id.to_string(), lp.key("vlans").index(j).key("id"))),
        );
        for (j, vlan) in link.vlans.iter().enumerate() {
            let vp = lp.key("vlans").index(j);
            let ifname = format!("{}.{}", link.name, vlan.id);
            if ifname.len() > 15 {
                c.error(
                    &vp.key("id"),
                    format!("VLAN interface name `{ifname}` is longer than 15 characters"),
                    "shorten the link name".to_string(),
                );
            }
            cidrs(c, &vp.key("addresses"), &vlan.addresses, &mut addrs);
        }
    }
    let parsed = addrs.into_iter().filter_map(|(a, p)| a.parse::<IpNet>().ok().map(|n| (n.addr().to_string(), p)));
    c.unique("address", parsed);
    by_link
}

fn cidrs(c: &mut Checker<'_, '_>, path: &Path, list: &[String], all: &mut Vec<(String, Path)>) {
    for (i, a) in list.iter().enumerate() {
        let p = path.index(i);
        match a.parse::<IpNet>() {
            Ok(_) => all.push((a.clone(), p)),
            Err(_) => {
                let help = if a.parse::<std::net::IpAddr>().is_ok() {
                    format!("add the prefix length, e.g. \"{a}/24\"")
                } else {
                    "write an address with its prefix length, e.g. \"10.40.0.10/24\" or \"fd00::10/64\"".to_string()
                };
                c.error(&p, format!("invalid address `{a}`"), help);
            }
        }
    }
}

fn fabric(c: &mut Checker<'_, '_>, r: &Recipe, ports: &HashMap<String, &Port>) {
    let Some(f) = &r.fabric else { return };
    let p = Path::root().key("fabric");
    let link_names: Vec<&str> = r.network.links.iter().map(|l| l.name.as_str()).collect();
    if f.links.is_empty() {
        c.error(
            &p.key("links"),
            "the fabric names no links",
            "list the links that carry RoCE, e.g. links = [\"data0\"]".to_string(),
        );
    }
    c.unique("fabric link", f.links.iter().enumerate().map(|(i, l)| (l.as_str(), p.key("links").index(i))));
    for (i, name) in f.links.iter().enumerate() {
        let lp = p.key("links").index(i);
        if !link_names.contains(&name.as_str()) {
            c.unknown(&lp, "link", name, &link_names, "[[network.links]]");
            continue;
        }
        let Some(port) = ports.get(name) else { continue };
        if !port.rdma.is_rdma() {
            c.error(
                &lp,
                format!(
                    "RDMA requested on link `{name}`, but its port `{}` ({}) has no RDMA capability",
                    port.name, port.card
                ),
                "put the fabric on a port with RDMA (see the board's ports with rdma ≠ \"none\")".to_string(),
            );
        }
        if f.pfc_required && !port.dcb {
            c.error(
                &lp,
                format!("PFC is required, but port `{}` of link `{name}` does not implement DCB", port.name),
                "use a DCB-capable port, or set pfc_required = false to run without PFC (RoCE is then lossy)"
                    .to_string(),
            );
        }
    }
    if let Some(ets) = &f.ets_bandwidth {
        let sum: u32 = ets.iter().sum();
        if ets.len() == 8 && sum != 100 {
            c.error(
                &p.key("ets_bandwidth"),
                format!("ETS bandwidth shares add up to {sum}%, not 100%"),
                "adjust the eight shares so they sum to 100".to_string(),
            );
        }
        let tc = f.lossless_priority as usize;
        if ets.get(tc) == Some(&0) {
            c.warn(
                &p.key("ets_bandwidth").index(tc),
                format!("the lossless priority {tc} gets 0% of the bandwidth"),
                "give the RoCE traffic class a share".to_string(),
            );
        }
    }
    c.unique(
        "DSCP value",
        f.dscp.iter().enumerate().map(|(i, d)| (d.dscp.to_string(), p.key("dscp").index(i).key("dscp"))),
    );
    if !f.dscp.is_empty() && !f.dscp.iter().any(|d| d.priority == f.lossless_priority) {
        c.warn(
            &p.key("dscp"),
            format!("no DSCP value maps to the lossless priority {}", f.lossless_priority),
            format!("RoCE data is usually DSCP 26: add {{ dscp = 26, priority = {} }}", f.lossless_priority),
        );
    }
}

fn zfs(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("zfs");
    if let Some(arc) = &r.zfs.arc_max {
        size(c, &p.key("arc_max"), arc);
    }
    for name in r.zfs.tunables.keys() {
        if !name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_') || name.is_empty() {
            c.error(
                &p.key("tunables").key(name),
                format!("invalid ZFS module parameter name `{name}`"),
                "parameter names are lowercase letters, digits and `_`, as in /sys/module/zfs/parameters/".to_string(),
            );
        }
        if name == "zfs_arc_max" {
            c.error(
                &p.key("tunables").key(name),
                "set the ARC cap with `arc_max`, not as a tunable",
                "write arc_max = \"96G\" in [zfs]".to_string(),
            );
        }
    }
}

fn size(c: &mut Checker<'_, '_>, path: &Path, s: &str) {
    if parse_size(s).is_none() {
        c.error(
            path,
            format!("invalid size `{s}`"),
            "write a number with an optional K, M, G, T or P suffix, e.g. \"96G\"".to_string(),
        );
    }
}

fn properties(c: &mut Checker<'_, '_>, path: &Path, props: &BTreeMap<String, String>) {
    for name in props.keys() {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '_' | ':' | '.' | '-'));
        if !ok {
            c.error(
                &path.key(name),
                format!("invalid ZFS property name `{name}`"),
                "property names are lowercase, e.g. recordsize, compression, atime".to_string(),
            );
        }
    }
}

fn pools(c: &mut Checker<'_, '_>, r: &Recipe, board: &Board) {
    let base = Path::root().key("pools");
    let bay_names: Vec<&str> = board.bays.iter().map(|b| b.name.as_str()).collect();
    c.unique("pool name", r.pools.iter().enumerate().map(|(i, p)| (p.name.as_str(), base.index(i).key("name"))));
    let mut used: Vec<(&str, Path)> = Vec::new();
    for (i, pool) in r.pools.iter().enumerate() {
        let pp = base.index(i);
        c.name(&pp.key("name"), "pool name", &pool.name, is_pool_name, "pool names start with a letter, hold letters, digits, `_` `-` `.` `:`, and are not mirror, raidz*, spare, log, draid* or c0…c9");
        if pool.vdevs.is_empty() {
            c.error(
                &pp.key("vdevs"),
                format!("pool `{}` has no vdevs", pool.name),
                "add at least one vdev, e.g. { type = \"mirror\", bays = [\"BAY01\", \"BAY02\"] }".to_string(),
            );
        }
        for (j, vdev) in pool.vdevs.iter().enumerate() {
            let vp = pp.key("vdevs").index(j);
            let (lo, hi) = vdev.kind.width_range();
            let n = vdev.bays.len();
            let kind = vdev.kind.zpool_word().unwrap_or("disk");
            if n < lo || n > hi {
                let want = if lo == hi { format!("exactly {lo}") } else { format!("at least {lo}") };
                c.error(
                    &vp.key("bays"),
                    format!("a {kind} vdev takes {want} disk{}, this one has {n}", if lo == 1 { "" } else { "s" }),
                    width_help(vdev.kind),
                );
            }
            for (k, bay) in vdev.bays.iter().enumerate() {
                used.push((bay.as_str(), vp.key("bays").index(k)));
            }
        }
        for (k, bay) in pool.spares.iter().enumerate() {
            used.push((bay.as_str(), pp.key("spares").index(k)));
        }
        let widths: Vec<usize> = pool.vdevs.iter().map(|v| v.bays.len()).collect();
        if widths.windows(2).any(|w| w[0] != w[1]) {
            c.warn(
                &pp.key("vdevs"),
                format!("pool `{}` mixes vdev widths {widths:?}", pool.name),
                "ZFS spreads writes unevenly over vdevs of different widths".to_string(),
            );
        }
        properties(c, &pp.key("properties"), &pool.properties);
        properties(c, &pp.key("filesystem"), &pool.filesystem);
    }
    for (bay, path) in &used {
        if !bay_names.contains(bay) {
            c.unknown(path, "bay", bay, &bay_names, &format!("board `{}`", board.board.name));
        }
    }
    c.unique("bay", used.iter().map(|(b, p)| (*b, p.clone())));
}

fn width_help(kind: crate::recipe::VdevKind) -> String {
    use crate::recipe::VdevKind::*;
    match kind {
        Disk => "a disk vdev is one bay; use mirror or raidz for several".into(),
        Mirror => "a mirror needs two or more bays".into(),
        Raidz1 => "raidz1 needs at least 2 bays (3–9 recommended)".into(),
        Raidz2 => "raidz2 needs at least 3 bays (4–9 recommended; 6 is the usual width)".into(),
        Raidz3 => "raidz3 needs at least 4 bays (5–9 recommended)".into(),
    }
}

fn datasets(c: &mut Checker<'_, '_>, r: &Recipe) {
    let base = Path::root().key("datasets");
    let pool_names: Vec<&str> = r.pools.iter().map(|p| p.name.as_str()).collect();
    c.unique("dataset", r.datasets.iter().enumerate().map(|(i, d)| (d.name.as_str(), base.index(i).key("name"))));
    for (i, ds) in r.datasets.iter().enumerate() {
        let dp = base.index(i);
        let (pool, rest) = ds.name.split_once('/').unwrap_or((ds.name.as_str(), ""));
        if rest.is_empty() {
            c.error(
                &dp.key("name"),
                format!("dataset `{}` has no pool part", ds.name),
                "name datasets POOL/NAME, e.g. \"tank/train\"; a pool's own properties go in its `filesystem` table"
                    .to_string(),
            );
        } else if !pool_names.contains(&pool) {
            c.unknown(&dp.key("name"), "pool", pool, &pool_names, "[[pools]]");
        } else if !rest.split('/').all(is_dataset_component) {
            c.error(
                &dp.key("name"),
                format!("invalid dataset name `{}`", ds.name),
                "each component holds letters, digits, `_` `-` `.` `:` and is not empty".to_string(),
            );
        }
        if let Some(q) = &ds.quota {
            size(c, &dp.key("quota"), q);
        }
        if let Some(q) = &ds.reservation {
            size(c, &dp.key("reservation"), q);
        }
        properties(c, &dp.key("properties"), &ds.properties);
    }
}

fn nfs(c: &mut Checker<'_, '_>, r: &Recipe) {
    let Some(nfs) = &r.nfs else { return };
    let p = Path::root().key("nfs");
    if nfs.versions.is_empty() {
        c.error(
            &p.key("versions"),
            "no NFS version is enabled",
            "enable at least one, e.g. versions = [\"4.2\"]".to_string(),
        );
    }
    c.unique("NFS version", nfs.versions.iter().enumerate().map(|(i, v)| (v.as_str(), p.key("versions").index(i))));
    if nfs.rdma_port == 2049 {
        c.error(
            &p.key("rdma_port"),
            "the RDMA port cannot be 2049, the TCP port",
            "use 20049, the IANA port for NFS over RDMA".to_string(),
        );
    }
    let mut exportable: Vec<&str> = r.datasets.iter().map(|d| d.name.as_str()).collect();
    exportable.extend(r.pools.iter().map(|p| p.name.as_str()));
    let rdma_links: Vec<&str> = r.fabric.iter().flat_map(|f| f.links.iter().map(String::as_str)).collect();
    let base = p.key("exports");
    c.unique(
        "export of dataset",
        nfs.exports.iter().enumerate().map(|(i, e)| (e.dataset.as_str(), base.index(i).key("dataset"))),
    );
    for (i, e) in nfs.exports.iter().enumerate() {
        let ep = base.index(i);
        if !exportable.contains(&e.dataset.as_str()) {
            c.unknown(&ep.key("dataset"), "dataset", &e.dataset, &exportable, "[[datasets]]");
        }
        if !e.tcp {
            // The kernel's nfsd has one set of listeners for all exports: an export cannot be
            // kept off TCP, and a setting that cannot be applied is refused.
            c.error(
                &ep.key("tcp"),
                format!("export of `{}` cannot be kept off TCP: nfsd serves every export on every listener", e.dataset),
                "remove tcp = false; limit who mounts it with its clients networks".to_string(),
            );
        }
        if !e.rdma
            && let Some(other) = nfs.exports.iter().find(|o| o.rdma)
        {
            c.warn(
                &ep.key("rdma"),
                format!(
                    "export of `{}` is reachable over RDMA too: nfsd listens on RDMA for `{}`, and its listeners serve every export",
                    e.dataset, other.dataset
                ),
                "set rdma = true to say so, or move it to another box".to_string(),
            );
        }
        if e.rdma && rdma_links.is_empty() {
            c.error(
                &ep.key("rdma"),
                format!("export of `{}` asks for RDMA, but no link carries RDMA", e.dataset),
                "add a [fabric] section naming an RDMA-capable link, or set rdma = false".to_string(),
            );
        }
        if e.clients.is_empty() {
            c.error(
                &ep.key("clients"),
                format!("export of `{}` has no clients", e.dataset),
                "add clients = [{ network = \"10.40.0.0/24\" }]".to_string(),
            );
        }
        c.unique(
            "client network",
            e.clients
                .iter()
                .enumerate()
                .map(|(j, cl)| (cl.network.as_str(), ep.key("clients").index(j).key("network"))),
        );
        for (j, cl) in e.clients.iter().enumerate() {
            let np = ep.key("clients").index(j).key("network");
            match cl.network.parse::<IpNet>() {
                Err(_) => c.error(
                    &np,
                    format!("invalid client network `{}`", cl.network),
                    "write a network in CIDR form, e.g. \"10.40.0.0/24\" (or \"10.40.0.7/32\" for one host)"
                        .to_string(),
                ),
                Ok(net) if net.trunc() != net => c.error(
                    &np,
                    format!("client network `{}` has host bits set", cl.network),
                    format!("did you mean \"{}\"?", net.trunc()),
                ),
                Ok(_) => {}
            }
        }
    }
}

/// Validates a board file.
pub fn board(doc: &Document<'_>, b: &Board) -> Vec<Diagnostic> {
    let mut c = Checker { doc, out: Vec::new() };
    let root = Path::root();
    c.name(
        &root.key("board").key("name"),
        "board name",
        &b.board.name,
        is_slug,
        "use lowercase letters, digits and dashes",
    );
    if b.cpu.threads < b.cpu.cores {
        c.error(
            &root.key("cpu").key("threads"),
            "fewer threads than cores",
            "threads counts hardware threads: cores × threads per core".to_string(),
        );
    }
    for (i, m) in b.kernel.modules.iter().enumerate() {
        c.name(
            &root.key("kernel").key("modules").index(i),
            "module name",
            m,
            is_module,
            "module names are letters, digits, `_` and `-`",
        );
    }
    packages(&mut c, &root.key("packages"), &b.packages);
    device_match(&mut c, &root.key("boot").key("match"), &b.boot.matcher, &["pci", "virtio_serial"]);
    let bays = root.key("bays");
    c.unique("bay", b.bays.iter().enumerate().map(|(i, bay)| (bay.name.as_str(), bays.index(i).key("name"))));
    for (i, bay) in b.bays.iter().enumerate() {
        c.name(
            &bays.index(i).key("name"),
            "bay name",
            &bay.name,
            is_bay,
            "bay names are uppercase letters and digits, e.g. BAY01",
        );
        device_match(&mut c, &bays.index(i).key("match"), &bay.matcher, &["pci", "serial"]);
    }
    let ports = root.key("ports");
    c.unique("port", b.ports.iter().enumerate().map(|(i, p)| (p.name.as_str(), ports.index(i).key("name"))));
    for (i, port) in b.ports.iter().enumerate() {
        c.name(
            &ports.index(i).key("name"),
            "port name",
            &port.name,
            is_ifname,
            "port names are 1–15 letters, digits, `-` and `_`",
        );
        device_match(&mut c, &ports.index(i).key("match"), &port.matcher, &["pci", "mac"]);
    }
    let matchers = b.bays.iter().enumerate().map(|(i, x)| (&x.matcher, bays.index(i).key("match")));
    let matchers = matchers.chain(b.ports.iter().enumerate().map(|(i, x)| (&x.matcher, ports.index(i).key("match"))));
    let keys: Vec<(String, Path)> = matchers.map(|(m, p)| (format!("{m:?}"), p)).collect();
    let mut seen = std::collections::HashSet::new();
    for (k, p) in &keys {
        if !seen.insert(k.as_str()) {
            c.error(
                p,
                "two devices have the same match",
                "each bay and port must be found by a different address or serial".to_string(),
            );
        }
    }
    c.out
}

fn device_match(c: &mut Checker<'_, '_>, path: &Path, m: &DeviceMatch, allowed: &[&str]) {
    let set: Vec<(&str, &str)> =
        [("pci", &m.pci), ("serial", &m.serial), ("mac", &m.mac), ("virtio_serial", &m.virtio_serial)]
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect();
    if set.len() != 1 {
        return c.error(
            path,
            format!("set exactly one of {}", allowed.join(", ")),
            "a device is found by one property".to_string(),
        );
    }
    let (key, value) = set[0];
    if !allowed.contains(&key) {
        return c.error(
            &path.key(key),
            format!("`{key}` cannot find this kind of device"),
            format!("use one of {}", allowed.join(", ")),
        );
    }
    let ok = match key {
        "pci" => is_pci_address(value),
        "mac" => is_mac(value),
        _ => !value.is_empty() && value.len() <= 20 && value.chars().all(|ch| ch.is_ascii_graphic()),
    };
    if !ok {
        let rule = match key {
            "pci" => "write a PCI address as DDDD:BB:DD.F, e.g. \"0000:41:00.0\"",
            "mac" => "write a MAC as six hex pairs, e.g. \"52:54:00:12:34:56\"",
            _ => "serials are 1–20 printable characters",
        };
        c.error(&path.key(key), format!("invalid {key} `{value}`"), rule.to_string());
    }
}

fn check_crypt_hash(h: &str) -> Result<(), String> {
    let fields: Vec<&str> = h.split('$').collect();
    // "$id$…$hash": the first field is empty because the string starts with '$'.
    if fields.len() < 4 || !fields[0].is_empty() {
        return Err("root_password_hash is not a crypt(3) hash (a plain password?)".into());
    }
    match fields[1] {
        "y" | "gy" | "7" | "2b" | "6" | "5" => {}
        "1" => return Err("root_password_hash uses MD5-crypt ($1$), which is too weak".into()),
        other => return Err(format!("root_password_hash uses an unknown scheme `${other}$`")),
    }
    if fields.last().is_none_or(|f| f.len() < 20) {
        return Err("root_password_hash is truncated".into());
    }
    Ok(())
}

fn is_slug(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !s.ends_with('-')
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|c| c.is_ascii_digit()))
}

fn is_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_package(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.'))
}

fn is_ifname(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b[0].is_ascii_alphabetic()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
}

fn is_module(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
}

fn is_bay(s: &str) -> bool {
    !s.is_empty() && s.len() <= 16 && s.bytes().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

fn is_pool_name(s: &str) -> bool {
    let b = s.as_bytes();
    let reserved = ["mirror", "raidz", "spare", "log", "draid"].iter().any(|r| s.starts_with(r))
        || (b.len() >= 2 && b[0] == b'c' && b[1].is_ascii_digit());
    !b.is_empty()
        && b.len() <= 200
        && b[0].is_ascii_alphabetic()
        && !reserved
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

fn is_dataset_component(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

fn is_pci_address(s: &str) -> bool {
    // DDDD:BB:DD.F
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11].iter().all(|&i| b[i].is_ascii_hexdigit())
        && (b[11] as char).to_digit(16).is_some_and(|f| f <= 7)
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_pci_address("0000:41:00.0"));
        assert!(!is_pci_address("0000:41:00.8"));
        assert!(!is_pci_address("41:00.0"));
        assert!(is_mac("52:54:00:aa:bb:01"));
        assert!(!is_mac("52:54:00:aa:bb"));
        assert!(is_pool_name("tank"));
        assert!(!is_pool_name("mirror1"));
        assert!(!is_pool_name("c0pool"));
        assert!(is_ifname("data0"));
        assert!(!is_ifname("a-very-long-interface"));
        assert!(is_version("1.0.12"));
        assert!(!is_version("1.0"));
        assert!(!is_version("1.0.x"));
    }

    #[test]
    fn crypt_hashes() {
        assert!(
            check_crypt_hash(
                "$6$saltsalt$Xq0HZl3kbtwXxt3gHGW0jqDOWyA5k8Fmc7y4xJv5ZcC3h1dVbWmYVQyo2UqDZr0b2X4ZSt0XQ0Qe7a3Dm1Hd1."
            )
            .is_ok()
        );
        assert!(check_crypt_hash("hunter2").is_err());
        assert!(check_crypt_hash("$1$abc$0123456789012345678901").is_err());
        assert!(check_crypt_hash("$6$salt$short").is_err());
    }
}
