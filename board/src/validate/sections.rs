//! The recipe, section by section.

use super::*;

pub(super) fn image(c: &mut Checker<'_, '_>, r: &Recipe) {
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

pub(super) fn packages(c: &mut Checker<'_, '_>, path: &Path, names: &[String]) {
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

pub(super) fn console(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("console");
    let dev = r.image.development;
    match r.console.root_login {
        RootLogin::Autologin if !dev => c.error(
            &p.key("root_login"),
            "root autologin on a production image",
            "autologin is only for development images: set `development = true` in [image], or use root_login = \"password\" (the operator sets it on first boot)".to_string(),
        ),
        // Without a hash, the first boot asks the operator for root's password on the console.
        RootLogin::Password => match &r.console.root_password_hash {
            None => {}
            // No shipped box may carry a password everyone who has the image knows.
            Some(_) if !dev => c.error(
                &p.key("root_password_hash"),
                "a production image carries no password: every box would share it",
                "remove root_password_hash; the first boot asks the operator to set root's password on the console".to_string(),
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
pub(super) fn links<'b>(c: &mut Checker<'_, '_>, r: &Recipe, board: &'b Board) -> HashMap<String, &'b Port> {
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
    allow(c, r);
    by_link
}

/// `[[network.allow]]`: a link the recipe has, networks in CIDR form.
fn allow(c: &mut Checker<'_, '_>, r: &Recipe) {
    let base = Path::root().key("network").key("allow");
    let ifaces: Vec<String> = r
        .network
        .links
        .iter()
        .flat_map(|l| std::iter::once(l.name.clone()).chain(l.vlans.iter().map(|v| format!("{}.{}", l.name, v.id))))
        .collect();
    let names: Vec<&str> = ifaces.iter().map(String::as_str).collect();
    for (i, a) in r.network.allow.iter().enumerate() {
        let ap = base.index(i);
        if !ifaces.contains(&a.link) {
            c.unknown(&ap.key("link"), "link", &a.link, &names, "[[network.links]]");
        }
        for (j, net) in a.from.iter().enumerate() {
            network(c, &ap.key("from").index(j), net);
        }
    }
}

/// A network in CIDR form without host bits, or says what is wrong with it.
fn network(c: &mut Checker<'_, '_>, at: &Path, net: &str) -> Option<IpNet> {
    match net.parse::<IpNet>() {
        Err(_) => c.error(
            at,
            format!("invalid network `{net}`"),
            "write a network in CIDR form, e.g. \"10.40.0.0/24\"".to_string(),
        ),
        Ok(n) if n.trunc() != n => {
            c.error(at, format!("network `{net}` has host bits set"), format!("did you mean \"{}\"?", n.trunc()))
        }
        Ok(n) => return Some(n),
    }
    None
}

pub(super) fn cidrs(c: &mut Checker<'_, '_>, path: &Path, list: &[String], all: &mut Vec<(String, Path)>) {
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

pub(super) fn fabric(c: &mut Checker<'_, '_>, r: &Recipe, ports: &HashMap<String, &Port>) {
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

pub(super) fn zfs(c: &mut Checker<'_, '_>, r: &Recipe) {
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

pub(super) fn size(c: &mut Checker<'_, '_>, path: &Path, s: &str) {
    if parse_size(s).is_none() {
        c.error(
            path,
            format!("invalid size `{s}`"),
            "write a number with an optional K, M, G, T or P suffix, e.g. \"96G\"".to_string(),
        );
    }
}

pub(super) fn properties(c: &mut Checker<'_, '_>, path: &Path, props: &BTreeMap<String, String>) {
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

pub(super) fn pools(c: &mut Checker<'_, '_>, r: &Recipe, board: &Board) {
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

pub(super) fn width_help(kind: crate::recipe::VdevKind) -> String {
    use crate::recipe::VdevKind::*;
    match kind {
        Disk => "a disk vdev is one bay; use mirror or raidz for several".into(),
        Mirror => "a mirror needs two or more bays".into(),
        Raidz1 => "raidz1 needs at least 2 bays (3–9 recommended)".into(),
        Raidz2 => "raidz2 needs at least 3 bays (4–9 recommended; 6 is the usual width)".into(),
        Raidz3 => "raidz3 needs at least 4 bays (5–9 recommended)".into(),
    }
}

pub(super) fn datasets(c: &mut Checker<'_, '_>, r: &Recipe) {
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
        space(c, &dp, &ds.quota, &ds.reservation, &ds.properties);
        if let Some((j, t)) = r.tenants.iter().enumerate().find(|(_, t)| t.dataset == ds.name) {
            let line = c.line_of(&Path::root().key("tenants").index(j).key("dataset"));
            c.error(
                &dp.key("name"),
                format!(
                    "`{}` is tenant `{}`'s dataset (line {line}), which nasos creates from the tenant",
                    ds.name, t.name
                ),
                "remove this entry and give its quota, reservation and properties in the tenant".to_string(),
            );
        }
    }
}

/// A dataset's (or a tenant's) quota, reservation and properties.
fn space(
    c: &mut Checker<'_, '_>,
    at: &Path,
    quota: &Option<String>,
    reservation: &Option<String>,
    props: &BTreeMap<String, String>,
) {
    if let Some(q) = quota {
        size(c, &at.key("quota"), q);
    }
    if let Some(q) = reservation {
        size(c, &at.key("reservation"), q);
    }
    properties(c, &at.key("properties"), props);
}

fn pool_of(dataset: &str) -> &str {
    dataset.split('/').next().unwrap_or(dataset)
}

/// `[[tenants]]`: names, datasets that do not nest, networks and VLANs no two tenants share.
pub(super) fn tenants(c: &mut Checker<'_, '_>, r: &Recipe) {
    let base = Path::root().key("tenants");
    let pool_names: Vec<&str> = r.pools.iter().map(|p| p.name.as_str()).collect();
    c.unique("tenant name", r.tenants.iter().enumerate().map(|(i, t)| (t.name.as_str(), base.index(i).key("name"))));
    // Every tenant network, with where it was written, to find overlaps across tenants.
    let mut nets: Vec<(IpNet, usize, Path)> = Vec::new();
    let mut vlans: Vec<(String, u32, usize, Path)> = Vec::new();
    let own_addresses: Vec<IpNet> = r
        .network
        .links
        .iter()
        .flat_map(|l| l.addresses.iter().chain(l.vlans.iter().flat_map(|v| v.addresses.iter())))
        .filter_map(|a| a.parse().ok())
        .collect();
    for (i, t) in r.tenants.iter().enumerate() {
        let tp = base.index(i);
        c.name(&tp.key("name"), "tenant name", &t.name, is_slug, "tenant names are lowercase letters, digits and `-`");
        let (pool, rest) = t.dataset.split_once('/').unwrap_or((t.dataset.as_str(), ""));
        if rest.is_empty() {
            c.error(
                &tp.key("dataset"),
                format!("tenant `{}` has the whole pool `{}`", t.name, t.dataset),
                format!("give it a dataset of its own, e.g. \"{}/{}\"", t.dataset, t.name),
            );
        } else if !pool_names.contains(&pool) {
            c.unknown(&tp.key("dataset"), "pool", pool, &pool_names, "[[pools]]");
        } else if !rest.split('/').all(is_dataset_component) {
            c.error(
                &tp.key("dataset"),
                format!("invalid dataset name `{}`", t.dataset),
                "each component holds letters, digits, `_` `-` `.` `:` and is not empty".to_string(),
            );
        }
        for (j, other) in r.tenants.iter().enumerate().take(i) {
            if within(&t.dataset, &other.dataset) || within(&other.dataset, &t.dataset) {
                let line = c.line_of(&base.index(j).key("dataset"));
                c.error(
                    &tp.key("dataset"),
                    format!(
                        "tenant `{}`'s dataset `{}` overlaps tenant `{}`'s `{}` (line {line})",
                        t.name, t.dataset, other.name, other.dataset
                    ),
                    "give each tenant its own subtree, side by side (e.g. tank/teams/a and tank/teams/b)".to_string(),
                );
            }
        }
        space(c, &tp, &t.quota, &t.reservation, &t.properties);
        if t.networks.is_empty() {
            c.error(
                &tp.key("networks"),
                format!("tenant `{}` has no client networks", t.name),
                "add networks = [\"10.40.1.0/24\"]: its exports are offered to these only".to_string(),
            );
        }
        for (j, net) in t.networks.iter().enumerate() {
            let np = tp.key("networks").index(j);
            match network(c, &np, net) {
                None => {}
                Some(n) if n.prefix_len() == 0 => c.error(
                    &np,
                    format!("`{net}` is every network: tenant `{}` would share its clients with every other", t.name),
                    "name the tenant's own client networks".to_string(),
                ),
                Some(n) => {
                    for (m, j2, other_path) in &nets {
                        if *j2 != i && overlaps(m, &n) {
                            let line = c.line_of(other_path);
                            c.error(
                                &np,
                                format!(
                                    "tenant `{}`'s network {n} overlaps tenant `{}`'s {m} (line {line})",
                                    t.name, r.tenants[*j2].name
                                ),
                                "a client address may belong to one tenant only: split the networks so they do not overlap".to_string(),
                            );
                        }
                    }
                    nets.push((n, i, np));
                }
            }
        }
        match (t.squash, t.anon_uid, t.anon_gid) {
            (crate::recipe::Squash::All, None, _) | (crate::recipe::Squash::All, _, None) => c.error(
                &tp.key("squash"),
                format!("tenant `{}` maps every user to one account, but does not say which", t.name),
                "add anon_uid and anon_gid (the uid and gid the tenant's files belong to)".to_string(),
            ),
            (crate::recipe::Squash::Root, Some(_), _) | (crate::recipe::Squash::Root, _, Some(_)) => c.error(
                &tp.key(if t.anon_uid.is_some() { "anon_uid" } else { "anon_gid" }),
                "anon_uid and anon_gid apply only with squash = \"all\"",
                "set squash = \"all\" to map every user to them, or remove them".to_string(),
            ),
            _ => {}
        }
        for (j, v) in t.vlans.iter().enumerate() {
            let vp = tp.key("vlans").index(j);
            let Some(link) = r.network.links.iter().find(|l| l.name == v.link) else {
                let names: Vec<&str> = r.network.links.iter().map(|l| l.name.as_str()).collect();
                c.unknown(&vp.key("link"), "link", &v.link, &names, "[[network.links]]");
                continue;
            };
            if !(1..=4094).contains(&v.id) {
                continue; // the schema said so
            }
            let ifname = format!("{}.{}", link.name, v.id);
            if ifname.len() > 15 {
                c.error(
                    &vp.key("id"),
                    format!("VLAN interface name `{ifname}` is longer than 15 characters"),
                    "shorten the link name".to_string(),
                );
            }
            if let Some(k) = link.vlans.iter().position(|x| x.id == v.id) {
                let li = r.network.links.iter().position(|l| l.name == v.link).unwrap_or(0);
                let line =
                    c.line_of(&Path::root().key("network").key("links").index(li).key("vlans").index(k).key("id"));
                c.error(
                    &vp.key("id"),
                    format!(
                        "VLAN {} on `{}` is the link's own VLAN (line {line}), not tenant `{}`'s",
                        v.id, v.link, t.name
                    ),
                    "give the tenant a VLAN id the link does not use".to_string(),
                );
            }
            if let Some((_, _, other, other_path)) =
                vlans.iter().find(|(l, id, o, _)| *l == v.link && *id == v.id && *o != i)
            {
                let line = c.line_of(other_path);
                c.error(
                    &vp.key("id"),
                    format!(
                        "VLAN {} on `{}` is tenant `{}`'s already (line {line}): a VLAN isolates one tenant",
                        v.id, v.link, r.tenants[*other].name
                    ),
                    "give each tenant its own VLAN id".to_string(),
                );
            }
            vlans.push((v.link.clone(), v.id, i, vp.key("id")));
            let mut addrs = Vec::new();
            cidrs(c, &vp.key("addresses"), &v.addresses, &mut addrs);
            for (a, ap) in addrs {
                if let Ok(n) = a.parse::<IpNet>()
                    && own_addresses.iter().any(|o| o.addr() == n.addr())
                {
                    c.error(
                        &ap,
                        format!("address {} is already one of the box's links'", n.addr()),
                        "give the tenant's VLAN an address of its own".to_string(),
                    );
                }
            }
        }
    }
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// An export inside a tenant's subtree: offered to the tenant's networks only, with its squash.
fn tenant_export(c: &mut Checker<'_, '_>, t: &crate::recipe::Tenant, e: &crate::recipe::Export, ep: &Path) {
    let nets: Vec<IpNet> = t.networks.iter().filter_map(|n| n.parse().ok()).collect();
    for (j, cl) in e.clients.iter().enumerate() {
        let cp = ep.key("clients").index(j);
        if let Ok(n) = cl.network.parse::<IpNet>()
            && !nets.iter().any(|m| m.contains(&n))
        {
            c.error(
                &cp.key("network"),
                format!(
                    "client network {n} is not one of tenant `{}`'s networks ({}): `{}` is the tenant's",
                    t.name,
                    t.networks.join(", "),
                    e.dataset
                ),
                "use a network inside the tenant's, or leave clients out to offer it to all of them".to_string(),
            );
        }
        if t.squash == crate::recipe::Squash::All && !cl.root_squash {
            c.error(
                &cp.key("root_squash"),
                format!("tenant `{}` maps every user, root too, to its account (squash = \"all\")", t.name),
                "remove root_squash = false, or change the tenant's squash".to_string(),
            );
        }
    }
}

/// Frequent periods that divide the hour, so every period starts at the same minutes each hour.
const FREQUENT_PERIODS: [u32; 12] = [1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60];
/// A hold longer than this is more likely a typo (`"14w"` for `"14d"`) than a retention rule.
const MAX_HOLD_SECONDS: u64 = 10 * 366 * 86_400;
/// More snapshots of one kind than this is a typo, and costs every listing.
const MAX_KEEP: u32 = 10_000;

pub(super) fn snapshots(c: &mut Checker<'_, '_>, r: &Recipe) {
    let base = Path::root().key("snapshots");
    let known: Vec<&str> = r.pools.iter().map(|p| p.name.as_str()).chain(r.dataset_names()).collect();
    c.unique(
        "snapshot policy for dataset",
        r.snapshots.iter().enumerate().map(|(i, p)| (p.dataset.as_str(), base.index(i).key("dataset"))),
    );
    for (i, policy) in r.snapshots.iter().enumerate() {
        let pp = base.index(i);
        let replica = r.peers.iter().find(|p| p.receive.contains(&policy.dataset));
        if let Some(peer) = replica {
            c.error(
                &pp.key("dataset"),
                format!(
                    "`{}` is a replica peer {} sends here: it gets that box's snapshots",
                    policy.dataset, peer.name
                ),
                "snapshots of its own would block the next send; set the policy on the source box".to_string(),
            );
        } else if !known.contains(&policy.dataset.as_str()) {
            c.unknown(&pp.key("dataset"), "dataset", &policy.dataset, &known, "[[pools]] and [[datasets]]");
        }
        // A dataset below a recursive policy already gets that policy's snapshots; a second
        // policy would take and prune the same names twice.
        if let Some(parent) = r.snapshots.iter().find(|o| {
            o.recursive && o.dataset != policy.dataset && policy.dataset.starts_with(&format!("{}/", o.dataset))
        }) {
            c.error(
                &pp.key("dataset"),
                format!("`{}` is below `{}`, whose snapshot policy is recursive", policy.dataset, parent.dataset),
                format!(
                    "a recursive policy snapshots every dataset below it; remove this policy or make the one for `{}` non-recursive",
                    parent.dataset
                ),
            );
        }
        if !FREQUENT_PERIODS.contains(&policy.frequent_minutes) {
            c.error(
                &pp.key("frequent_minutes"),
                format!("frequent_minutes = {} does not divide the hour", policy.frequent_minutes),
                format!("use one of {}", FREQUENT_PERIODS.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
            );
        }
        let counts = [
            ("frequently", policy.frequently),
            ("hourly", policy.hourly),
            ("daily", policy.daily),
            ("weekly", policy.weekly),
            ("monthly", policy.monthly),
        ];
        for (key, n) in counts {
            if n > MAX_KEEP {
                c.error(
                    &pp.key(key),
                    format!("{key} = {n} keeps more than {MAX_KEEP} snapshots"),
                    "keep fewer, and keep the longer history in a coarser kind (daily, weekly, monthly)".to_string(),
                );
            }
        }
        if counts.iter().all(|(_, n)| *n == 0) {
            c.error(
                &pp,
                format!("the snapshot policy for `{}` keeps no snapshot of any kind", policy.dataset),
                "set at least one of frequently, hourly, daily, weekly, monthly, or remove the policy".to_string(),
            );
        }
        if let Some(h) = &policy.hold {
            match parse_duration(h) {
                None => c.error(
                    &pp.key("hold"),
                    format!("invalid duration `{h}`"),
                    "write a whole number with a unit: s, m, h, d or w, e.g. \"14d\"".to_string(),
                ),
                Some(s) if s > MAX_HOLD_SECONDS => c.error(
                    &pp.key("hold"),
                    format!("a hold of `{h}` is longer than ten years"),
                    "holds are a retention time; was a shorter unit meant (\"14d\", not \"14w\")?".to_string(),
                ),
                Some(_) => {}
            }
        }
    }
}

/// Peers and what is sent to them.
pub(super) fn replication(c: &mut Checker<'_, '_>, r: &Recipe) {
    let base = Path::root().key("peers");
    c.unique("peer name", r.peers.iter().enumerate().map(|(i, p)| (p.name.as_str(), base.index(i).key("name"))));
    let nets: Vec<IpNet> = r
        .network
        .links
        .iter()
        .flat_map(|l| l.addresses.iter().chain(l.vlans.iter().flat_map(|v| v.addresses.iter())))
        .filter_map(|a| a.parse().ok())
        .collect();
    let own: Vec<&str> = r.pools.iter().map(|p| p.name.as_str()).collect();
    let defined: Vec<&str> = r.dataset_names().collect();
    for (i, peer) in r.peers.iter().enumerate() {
        let pp = base.index(i);
        c.name(&pp.key("name"), "peer name", &peer.name, is_slug, "peer names are lowercase letters, digits and `-`");
        match peer.address.parse::<std::net::IpAddr>() {
            Err(_) => c.error(
                &pp.key("address"),
                format!("`{}` is not an IP address", peer.address),
                "give the peer's address on the link between the boxes, e.g. \"10.77.0.2\"".to_string(),
            ),
            Ok(ip) if !nets.iter().any(|n| n.contains(&ip)) => c.error(
                &pp.key("address"),
                format!("{} is in no subnet of this box's links, so the boxes cannot reach each other", peer.address),
                "give the peer an address in the subnet of one of [[network.links]] addresses".to_string(),
            ),
            Ok(ip) if nets.iter().any(|n| n.addr() == ip) => c.error(
                &pp.key("address"),
                format!("{} is this box's own address", peer.address),
                "give the other box's address".to_string(),
            ),
            Ok(_) => {}
        }
        for (j, ds) in peer.receive.iter().enumerate() {
            let at = pp.key("receive").index(j);
            let pool = ds.split('/').next().unwrap_or(ds);
            if !ds.contains('/') || !own.contains(&pool) {
                c.error(
                    &at,
                    format!("`{ds}` is not a dataset in a pool of this box"),
                    format!("name it POOL/NAME in one of the pools: {}", own.join(", ")),
                );
            } else if defined.contains(&ds.as_str()) {
                c.error(
                    &at,
                    format!("`{ds}` is also in [[datasets]]: storage would make it, and the peer's first send would find a dataset it did not make"),
                    "remove it from [[datasets]]: a replica is made by the first receive, read-only".to_string(),
                );
            }
        }
    }
    let base = Path::root().key("replicate");
    let known: Vec<&str> = own.iter().copied().chain(defined.iter().copied()).collect();
    let peer_names: Vec<&str> = r.peers.iter().map(|p| p.name.as_str()).collect();
    c.unique(
        "replication of",
        r.replicate
            .iter()
            .enumerate()
            .map(|(i, j)| (format!("{} to {}", j.dataset, j.to), base.index(i).key("dataset"))),
    );
    for (i, job) in r.replicate.iter().enumerate() {
        let jp = base.index(i);
        if !known.contains(&job.dataset.as_str()) {
            c.unknown(&jp.key("dataset"), "dataset", &job.dataset, &known, "[[pools]] and [[datasets]]");
        }
        if !peer_names.contains(&job.to.as_str()) {
            c.unknown(&jp.key("to"), "peer", &job.to, &peer_names, "[[peers]]");
        }
        if !(1..=1440).contains(&job.every_minutes) {
            c.error(
                &jp.key("every_minutes"),
                format!("every_minutes = {} is outside 1–1440", job.every_minutes),
                "send at least once a day and at most once a minute".to_string(),
            );
        }
        if let Some(b) = &job.bandwidth
            && parse_size(b).is_none_or(|n| n < 1 << 20)
        {
            c.error(
                &jp.key("bandwidth"),
                format!("invalid bandwidth `{b}`"),
                "bytes per second with a K, M or G suffix, at least 1M, e.g. \"100M\"".to_string(),
            );
        }
        if let Some(lag) = job.lag_alert_minutes
            && lag < job.every_minutes
        {
            c.error(
                &jp.key("lag_alert_minutes"),
                format!("an alert after {lag} min would fire between two sends {} min apart", job.every_minutes),
                format!("set it to at least {} (every_minutes), better a few intervals more", job.every_minutes),
            );
        }
    }
}

/// The peers' key files and the development identity.
pub(super) fn replication_keys(
    c: &mut Checker<'_, '_>,
    r: &Recipe,
    peers: &[crate::KeyFile],
    identity: Option<&crate::KeyFile>,
) -> (Vec<String>, Option<String>) {
    let mut keys = Vec::new();
    for (i, f) in peers.iter().enumerate() {
        let at = Path::root().key("peers").index(i).key("key");
        match &f.text {
            Err(e) => c.error(
                &at,
                format!("cannot read the key file {e}"),
                "key files are named relative to the recipe's directory, e.g. \"keys/dr.pub\"".to_string(),
            ),
            Ok(t) if !is_ssh_public_key(t) => c.error(
                &at,
                format!("`{}` is not an OpenSSH ed25519 public key", f.name),
                "give the line `nasctl replication key` prints on the peer (ssh-ed25519 AAAA… NAME)".to_string(),
            ),
            Ok(t) => keys.push(t.trim().to_string()),
        }
    }
    let mut secret = None;
    if let Some(f) = identity {
        let at = Path::root().key("replication").key("identity");
        if !r.image.development {
            c.error(
                &at,
                "a replication identity in the recipe gives every box of the image the same secret key",
                "remove it: each production box makes its own on first boot (`nasctl replication key` prints it)"
                    .to_string(),
            );
        }
        match &f.text {
            Err(e) => c.error(&at, format!("cannot read the key file {e}"), None),
            Ok(t) if !t.trim_start().starts_with("-----BEGIN OPENSSH PRIVATE KEY-----") => c.error(
                &at,
                format!("`{}` is not an OpenSSH private key", f.name),
                "make one with ssh-keygen -t ed25519 -N '' -f FILE".to_string(),
            ),
            Ok(t) => secret = Some(t.clone()),
        }
    }
    (keys, secret)
}

fn is_ssh_public_key(text: &str) -> bool {
    let t = text.trim();
    let mut parts = t.split_whitespace();
    t.lines().count() == 1
        && parts.next() == Some("ssh-ed25519")
        && parts.next().is_some_and(|k| k.starts_with("AAAAC3NzaC1lZDI1NTE5") && k.len() > 60)
}

pub(super) fn nfs(c: &mut Checker<'_, '_>, r: &Recipe) {
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
    let mut exportable: Vec<&str> = r.dataset_names().collect();
    exportable.extend(r.pools.iter().map(|p| p.name.as_str()));
    // A replica a peer sends here can be served (read-only until promoted).
    exportable.extend(r.peers.iter().flat_map(|p| p.receive.iter().map(String::as_str)));
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
        if e.security.is_empty() {
            c.error(
                &ep.key("security"),
                format!("export of `{}` offers no security flavour, so no client could mount it", e.dataset),
                "remove `security` for sec=sys, or name one, e.g. security = [\"krb5p\"]".to_string(),
            );
        }
        c.unique(
            "security flavour",
            e.security.iter().enumerate().map(|(j, f)| (f.as_str(), ep.key("security").index(j))),
        );
        if let Some((j, f)) = e.security.iter().enumerate().find(|(_, f)| f.kerberos())
            && r.kerberos.is_none()
        {
            c.error(
                &ep.key("security").index(j),
                format!("export of `{}` asks for {}, but the recipe names no Kerberos realm", e.dataset, f.as_str()),
                "add [kerberos] with realm = \"EXAMPLE.COM\" (and the users whose files it holds)".to_string(),
            );
        }
        let tenant = r.tenant_of(&e.dataset);
        if let Some(t) = tenant {
            tenant_export(c, t, e, &ep);
        }
        for t in r.tenants.iter().filter(|t| t.dataset != e.dataset && within(&t.dataset, &e.dataset)) {
            c.error(
                &ep.key("dataset"),
                format!(
                    "export of `{}` holds tenant `{}`'s dataset `{}`: its clients would reach the tenant's files (nfsd crosses into the datasets below an export)",
                    e.dataset, t.name, t.dataset
                ),
                format!("export datasets beside the tenants' (e.g. `{}/shared`), not above them", pool_of(&e.dataset)),
            );
        }
        if e.clients.is_empty() && tenant.is_none() {
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
                Ok(net) => {
                    let cp = ep.key("clients").index(j);
                    if net.prefix_len() == 0 && cl.access == crate::recipe::Access::Rw && !cl.i_understand {
                        c.error(
                            &np,
                            format!("`{}` lets any host that reaches the box write to this export", cl.network),
                            "name the clients' networks (e.g. \"10.40.0.0/24\"), or add `i_understand = true` to this client entry if every network that reaches the box may write".to_string(),
                        );
                    }
                    if !cl.root_squash && !cl.i_understand {
                        c.error(
                            &cp.key("root_squash"),
                            "root_squash = false lets root on any of these clients act as root on the export's files".to_string(),
                            "keep root squash on, or add `i_understand = true` to this client entry if these clients' root is trusted".to_string(),
                        );
                    }
                }
            }
        }
    }
}

/// `[kerberos]`: a realm in capitals, accounts that do not collide, and an export that uses it.
pub(super) fn kerberos(c: &mut Checker<'_, '_>, r: &Recipe) {
    let Some(k) = &r.kerberos else { return };
    let p = Path::root().key("kerberos");
    if !is_realm(&k.realm) {
        c.error(
            &p.key("realm"),
            format!("invalid realm `{}`", k.realm),
            format!("realms are written in capitals by convention, e.g. \"{}\"", k.realm.to_ascii_uppercase()),
        );
    }
    let users = p.key("users");
    c.unique("user", k.users.iter().enumerate().map(|(i, u)| (u.name.as_str(), users.index(i).key("name"))));
    c.unique("uid", k.users.iter().enumerate().map(|(i, u)| (u.uid.to_string(), users.index(i).key("uid"))));
    for (i, u) in k.users.iter().enumerate() {
        c.name(
            &users.index(i).key("name"),
            "user name",
            &u.name,
            is_login,
            "user names are lowercase letters, digits, `_` and `-`, starting with a letter (at most 32)",
        );
    }
    let used = r.nfs.iter().flat_map(|n| n.exports.iter()).any(|e| e.security.iter().any(|f| f.kerberos()));
    if !used {
        c.warn(
            &p.key("realm"),
            "no export asks for Kerberos, so the realm is not used",
            "add security = [\"krb5p\"] to the exports that need it".to_string(),
        );
    }
}

pub(super) fn liveness(c: &mut Checker<'_, '_>, r: &Recipe) {
    let names = crate::plan::SERVICE_NAMES;
    let p = Path::root().key("liveness").key("start_timeouts");
    for (name, secs) in &r.liveness.start_timeouts {
        if !names.contains(&name.as_str()) {
            c.unknown(&p.key(name), "service", name, names, "the service graph");
        } else if *secs < 5 {
            c.error(
                &p.key(name),
                format!("a start timeout of {secs}s for `{name}` is too short"),
                "give it at least 5 seconds".to_string(),
            );
        }
    }
    let p = Path::root().key("debug").key("hang_services");
    for (i, name) in r.debug.hang_services.iter().enumerate() {
        if !names.contains(&name.as_str()) {
            c.unknown(&p.index(i), "service", name, names, "the service graph");
        }
    }
    if !r.debug.hang_services.is_empty() && !r.image.development {
        c.error(
            &p,
            "hanging services on purpose is a fault injection for development images only",
            "remove [debug] hang_services, or set development = true in [image]".to_string(),
        );
    }
}

pub(super) fn health(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("health");
    for (i, url) in r.health.syslog.iter().enumerate() {
        if let Err(e) = crate::plan::SyslogTarget::parse(url) {
            c.error(
                &p.key("syslog").index(i),
                format!("invalid syslog receiver `{url}`: {e}"),
                "write it as \"udp://10.0.0.5:514\" or \"tcp://10.0.0.5:601\"".to_string(),
            );
        }
    }
    if let Some(m) = &r.health.metrics {
        let mp = p.key("metrics");
        let own: Vec<&str> = r
            .network
            .links
            .iter()
            .flat_map(|l| l.addresses.iter().chain(l.vlans.iter().flat_map(|v| v.addresses.iter())))
            .map(|a| a.split('/').next().unwrap_or(a))
            .collect();
        if m.address.parse::<std::net::IpAddr>().is_err() {
            c.error(
                &mp.key("address"),
                format!("`{}` is not an IP address", m.address),
                "use one of the box's own addresses from [[network.links]]".to_string(),
            );
        } else if !own.contains(&m.address.as_str()) {
            c.error(
                &mp.key("address"),
                format!("`{}` is not an address of this box, so nothing would answer there", m.address),
                format!(
                    "use one of {}",
                    if own.is_empty() {
                        "the addresses of [[network.links]] (none is set)".to_string()
                    } else {
                        own.join(", ")
                    }
                ),
            );
        }
        if [0u16, 22, 111, 2049, 20049].contains(&m.port) {
            c.error(
                &mp.key("port"),
                format!("port {} is taken (or not a port)", m.port),
                "use another port, e.g. 9100".to_string(),
            );
        }
    }
}

pub(super) fn upgrade(c: &mut Checker<'_, '_>, r: &Recipe) {
    let p = Path::root().key("upgrade");
    if !is_version(&r.upgrade.min_version) {
        c.error(
            &p.key("min_version"),
            format!("invalid version `{}`", r.upgrade.min_version),
            "write it as MAJOR.MINOR.PATCH, e.g. \"1.4.0\"".to_string(),
        );
    }
}

pub(super) fn trusted_keys(
    c: &mut Checker<'_, '_>,
    r: &Recipe,
    files: &[crate::KeyFile],
) -> Vec<crate::plan::TrustedKeyPlan> {
    let p = Path::root().key("upgrade").key("trusted_keys");
    if files.is_empty() && !r.image.development {
        c.warn(
            &Path::root().key("upgrade"),
            "this recipe trusts no upgrade keys: its boxes will refuse every bundle",
            "make a key pair with `nasos keygen --out DIR` on the release signer and list DIR/NAME.pub in [upgrade] trusted_keys".to_string(),
        );
    }
    let mut keys: Vec<crate::plan::TrustedKeyPlan> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let at = p.index(i);
        let text = match &f.text {
            Ok(t) => t,
            Err(e) => {
                c.error(
                    &at,
                    format!("cannot read the key file {e}"),
                    "key files are named relative to the recipe's directory, e.g. \"keys/nasos-dev.pub\"".to_string(),
                );
                continue;
            }
        };
        let key = match nasos_bundle::trust::TrustedKey::parse(text) {
            Ok(k) => k,
            Err(e) => {
                c.error(
                    &at,
                    format!("`{}` is {e}", f.name),
                    "give the public key file (NAME.pub) that `nasos keygen` or `minisign -G` wrote".to_string(),
                );
                continue;
            }
        };
        if f.secret_beside && !r.image.development {
            c.error(
                &at,
                format!("the secret key of `{}` lies beside it: whoever has this tree can sign upgrades for every box of this product", f.name),
                "trust a key whose secret is kept off the repository (on the release signer); development keys are for development images".to_string(),
            );
        }
        if keys.iter().any(|k| k.id == key.id) {
            c.error(&at, format!("key {} is listed twice", key.id), "list each key once".to_string());
            continue;
        }
        keys.push(crate::plan::TrustedKeyPlan {
            id: key.id.clone(),
            file: f.name.clone(),
            key: text.trim().to_string() + "\n",
        });
    }
    keys
}

/// `[secure_boot] db`: a readable PEM certificate. Its key beside it in a product recipe is
/// warned about: whoever has the tree could sign boot chains every box of the product trusts.
pub(super) fn secure_boot(c: &mut Checker<'_, '_>, r: &Recipe, file: Option<&crate::KeyFile>) {
    let (Some(sb), Some(f)) = (&r.secure_boot, file) else { return };
    let at = Path::root().key("secure_boot").key("db");
    match &f.text {
        Err(e) => c.error(
            &at,
            format!("cannot read the Secure Boot db certificate {e}"),
            "name the db.crt that `nasos keygen --secure-boot DIR` wrote, relative to the recipe's directory".to_string(),
        ),
        Ok(t) if !t.contains("-----BEGIN CERTIFICATE-----") => c.error(
            &at,
            format!("`{}` is not a PEM X.509 certificate", sb.db),
            "name the certificate (db.crt), not its key; `nasos keygen --secure-boot DIR` makes both".to_string(),
        ),
        Ok(_) if f.secret_beside && !r.image.development => c.warn(
            &at,
            format!("the secret key of `{}` lies beside it: whoever has this tree can sign boot chains for every box of this product", sb.db),
            "keep the product's db key off the repository and pass it with `nasos build --secure-boot-key FILE`".to_string(),
        ),
        Ok(_) => {}
    }
}
