//! `nasctl upgrade apply http://…` streams a bundle from a real HTTP server (Python's
//! http.server on loopback) through the upgrade agent's source and the bundle reader, never
//! storing it whole; a 404 and a refused connection are errors that name the URL.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nasos_bundle::{Kind, Manifest, Payload, TrustedKeys, reader, writer};
use nasos_services::upgrade::source;
use sha2::{Digest, Sha256};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

#[test]
fn a_bundle_streams_over_http() {
    let dir = std::env::temp_dir().join(format!("nasos-http-source-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // A bundle with 4 MiB of root, signed like `nasos bundle` signs.
    let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keygen");
    let pk = kp.pk.to_box().expect("pk").to_string();
    let data: Vec<Vec<u8>> =
        [4096usize, 4 << 20, 65536].iter().map(|n| (0..*n).map(|i| (i % 251) as u8).collect()).collect();
    let mut m = Manifest {
        format: nasos_bundle::FORMAT,
        image: "qemu-dev".into(),
        version: "0.2.0".into(),
        board: "qemu-q35".into(),
        min_version: "0.0.0".into(),
        verity: format!("{}:{}:1024:{}", "ab".repeat(32), "cd".repeat(32), 4 << 20),
        payloads: Vec::new(),
    };
    for (k, d) in Kind::ORDER.iter().zip(&data) {
        m.payloads.push(Payload { kind: *k, size: d.len() as u64, sha256: format!("{:x}", Sha256::digest(d)) });
    }
    let json = m.to_json();
    let sig = minisign::sign(None, &kp.sk, std::io::Cursor::new(&json), None, None).expect("sign").to_string();
    let bytes = writer::write(Vec::new(), &m, &json, &sig, |k| {
        let i = Kind::ORDER.iter().position(|x| *x == k).unwrap_or(0);
        Ok(std::io::Cursor::new(data[i].clone()))
    })
    .expect("write");
    std::fs::write(dir.join("b.nasos"), &bytes).expect("bundle");

    let port = free_port();
    let _server = Server(
        Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1", &port.to_string(), "--directory"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 http.server"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "http.server did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    let url = format!("http://127.0.0.1:{port}/b.nasos");
    let src = source::open(&url).expect("open");
    assert_eq!(src.len, Some(bytes.len() as u64));
    let keys = TrustedKeys::parse([pk.as_str()]).expect("keys");
    let mut got = Vec::new();
    reader::read(
        src.reader,
        &keys,
        |_| Ok(()),
        |_, r| {
            let mut v = Vec::new();
            r.read_to_end(&mut v)?;
            got.push(v);
            Ok(())
        },
    )
    .expect("the bundle reads and verifies over HTTP");
    assert_eq!(got, data);

    let missing = source::open(&format!("http://127.0.0.1:{port}/none.nasos")).err().expect("a 404 is an error");
    assert!(format!("{missing:#}").contains("none.nasos"), "{missing:#}");
    let refused = source::open(&format!("http://127.0.0.1:{}/b.nasos", free_port())).err().expect("no server");
    assert!(format!("{refused:#}").contains("fetching http://127.0.0.1:"), "{refused:#}");
    let https = source::open("https://example.invalid/b.nasos").err().expect("https refused");
    assert!(https.to_string().contains("https is not supported"), "{https}");
    let _ = std::fs::remove_dir_all(&dir);
}
