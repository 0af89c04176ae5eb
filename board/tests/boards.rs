//! The built-in boards are valid, and board mistakes are caught like recipe mistakes.

use nasos_board::board::RdmaKind;
use nasos_board::{BOARDS, SourceFile, find_board, load_board};

#[test]
fn builtin_boards_are_valid_and_complete() {
    for (name, _) in BOARDS {
        let (file, text) = find_board(name).expect("built-in board");
        let (board, warnings) =
            load_board(&SourceFile::new(file.clone(), text)).unwrap_or_else(|e| panic!("{file}: {e:#?}"));
        assert!(warnings.is_empty(), "{file}: {warnings:#?}");
        assert_eq!(&board.board.name, name, "{file}: the board's name must match its file name");
        let bays: Vec<&str> = board.bays.iter().map(|b| b.name.as_str()).collect();
        let want: Vec<String> = (1..=12).map(|i| format!("BAY{i:02}")).collect();
        assert_eq!(bays, want, "{file}: twelve bays BAY01..BAY12 in order");
        assert!(board.ports.iter().any(|p| p.rdma.is_rdma()), "{file}: at least one RDMA port");
    }
}

#[test]
fn the_product_board_is_the_reference_hardware() {
    let (file, text) = find_board("ts-h1290fx").expect("board");
    let (b, _) = load_board(&SourceFile::new(file, text)).expect("valid");
    assert_eq!(b.cpu.model, "AMD EPYC 7302P");
    assert_eq!((b.cpu.cores, b.cpu.threads, b.cpu.numa_nodes), (16, 32, 1));
    assert_eq!(b.memory.max_gib, 1024);
    assert!(b.memory.ecc);
    assert_eq!(b.watchdog.driver, "sp5100_tco");
    assert_eq!((b.console.device.as_str(), b.console.baud), ("ttyS0", 115200));
    assert!(b.kernel.cmdline.iter().any(|c| c == "iommu=pt"));
    assert!(b.bays.iter().all(|bay| bay.matcher.pci.is_some()), "real bays are found by PCI slot");
    let speeds = |s: u32| b.ports.iter().filter(|p| p.speed_mbps == s).count();
    assert_eq!((speeds(25_000), speeds(2_500), speeds(100_000)), (2, 2, 2));
    assert!(b.ports.iter().filter(|p| p.speed_mbps == 100_000).all(|p| p.rdma == RdmaKind::Irdma && p.dcb));
    let (file, text) = find_board("ts-h1290fx-cx6").expect("board");
    let (cx, _) = load_board(&SourceFile::new(file, text)).expect("valid");
    assert!(cx.ports.iter().any(|p| p.rdma == RdmaKind::Mlx5 && p.driver == "mlx5_core"));
}

#[test]
fn the_twin_board_matches_the_product_topology() {
    let (file, text) = find_board("qemu-q35").expect("board");
    let (b, _) = load_board(&SourceFile::new(file, text)).expect("valid");
    assert!(b.board.emulated);
    assert_eq!(b.watchdog.driver, "i6300esb");
    for bay in &b.bays {
        assert_eq!(bay.matcher.serial.as_deref(), Some(bay.name.as_str()), "twin bays are found by serial");
    }
    assert!(b.ports.iter().filter(|p| p.rdma.is_rdma()).all(|p| p.rdma == RdmaKind::SoftRoce && !p.dcb));
}

#[test]
fn board_mistakes_are_located() {
    let (_, text) = find_board("qemu-q35").expect("board");
    let broken = text
        .replacen("name = \"BAY02\"", "name = \"BAY01\"", 1)
        .replacen("{ serial = \"BAY03\" }", "{ serial = \"BAY03\", pci = \"0000:00:03.0\" }", 1)
        .replacen("{ mac = \"52:54:00:0a:00:11\" }", "{ mac = \"52:54:00:0a:00\" }", 1);
    let errs = load_board(&SourceFile::new("b.toml", broken.clone())).expect_err("invalid board");
    let msgs: Vec<String> = errs.iter().map(|d| d.to_string()).collect();
    let line_of = |needle: &str| broken.lines().position(|l| l.contains(needle)).map(|i| i + 1).expect("needle");
    let dup = format!("b.toml:{}:8: error: duplicate bay `BAY01`", line_of("name = \"BAY01\"") + 4);
    assert!(msgs.iter().any(|m| m.starts_with(&dup)), "{dup} not in {msgs:#?}");
    assert!(msgs.iter().any(|m| m.contains("set exactly one of pci, serial")), "{msgs:#?}");
    assert!(msgs.iter().any(|m| m.contains("invalid mac `52:54:00:0a:00`")), "{msgs:#?}");
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
}
