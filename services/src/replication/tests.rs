use super::*;

fn snap(name: &str, guid: u64) -> Snap {
    Snap { name: name.into(), guid, created: 1_796_161_500 + guid }
}

#[test]
fn a_send_is_full_then_incremental_from_the_newest_common_snapshot() {
    let source =
        [snap("auto-a-frequently", 1), snap("repl-dr-1", 2), snap("auto-b-frequently", 3), snap("repl-dr-2", 4)];
    let empty = TargetState::default();
    assert_eq!(plan_send("tank/train", "dr", &source, &empty), Ok(Send::Full("repl-dr-2".into())));
    let target = TargetState {
        exists: true,
        snapshots: vec![snap("auto-a-frequently", 1), snap("repl-dr-1", 2)],
        ..empty.clone()
    };
    assert_eq!(
        plan_send("tank/train", "dr", &source, &target),
        Ok(Send::Incremental("repl-dr-1".into(), "repl-dr-2".into()))
    );
    let done = TargetState { snapshots: source.to_vec(), ..target.clone() };
    assert_eq!(plan_send("tank/train", "dr", &source, &done), Ok(Send::UpToDate));
    assert_eq!(common(&source, &target.snapshots).map(|s| s.guid), Some(2));
}

#[test]
fn a_cut_send_resumes_and_a_foreign_or_promoted_target_is_refused() {
    let source = [snap("repl-dr-1", 1)];
    let cut = TargetState { exists: true, resume_token: Some("1-abc".into()), ..TargetState::default() };
    assert_eq!(plan_send("tank/train", "dr", &source, &cut), Ok(Send::Resume("1-abc".into())));
    let foreign = TargetState { exists: true, snapshots: vec![snap("other", 99)], ..TargetState::default() };
    let e = plan_send("tank/train", "dr", &source, &foreign).expect_err("no common snapshot");
    assert!(e.contains("shares no snapshot") && e.contains("never overwrites"), "{e}");
    let promoted = TargetState { promoted: true, ..foreign };
    let e = plan_send("tank/train", "dr", &source, &promoted).expect_err("promoted");
    assert!(e.contains("was promoted on dr"), "{e}");
    assert!(plan_send("tank/train", "dr", &[], &TargetState::default()).is_err());
}

#[test]
fn the_target_mirrors_the_source_but_keeps_the_common_base_and_its_own() {
    let target = [
        snap("auto-a-frequently", 1),
        snap("mine", 2),
        snap("repl-dr-1", 3),
        snap("auto-b-frequently", 4),
        snap("repl-dr-2", 5),
    ];
    // The source pruned a and repl-dr-1; it still has b and repl-dr-2.
    assert_eq!(target_prune(&target, &[4, 5]), ["auto-a-frequently", "repl-dr-1"]);
    // Nothing in common (a source that lost everything): nothing is pruned.
    assert!(target_prune(&target, &[77]).is_empty());
    // Newer snapshots than the common one are never pruned (a send still on its way).
    assert!(target_prune(&target, &[1]).is_empty());
    let source = [snap("repl-dr-1", 3), snap("auto-b-frequently", 4), snap("repl-dr-2", 5), snap("repl-other-1", 6)];
    assert_eq!(source_prune(&source, "dr", "repl-dr-2"), ["repl-dr-1"]);
}

#[test]
fn the_forced_command_takes_one_verb_and_one_allowed_dataset() {
    let allowed = vec!["tank/train".to_string()];
    assert_eq!(parse_request("state tank/train", "primary", &allowed), Ok(Request::State("tank/train".into())));
    assert_eq!(parse_request("receive tank/train", "primary", &allowed), Ok(Request::Receive("tank/train".into())));
    assert_eq!(parse_request("prune tank/train", "primary", &allowed), Ok(Request::Prune("tank/train".into())));
    for bad in
        ["", "sh", "receive tank/other", "receive tank/train; sh", "destroy tank/train", "state tank/train extra"]
    {
        let e = parse_request(bad, "primary", &allowed).expect_err(bad);
        assert!(e.starts_with("refused"), "{bad}: {e}");
    }
    let e = parse_request("receive tank/other", "primary", &allowed).expect_err("not allowed");
    assert!(e.contains("may not write tank/other") && e.contains("tank/train"), "{e}");
}
