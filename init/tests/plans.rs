//! The service graphs of the shipped recipes are graphs nasinit accepts.

use std::path::Path;

#[test]
fn shipped_plans_have_valid_service_graphs() {
    for r in ["ts-h1290fx", "qemu-dev", "qemu-client"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../recipes/{r}.toml"));
        let loaded = nasos_board::load_recipe_file(&path).unwrap_or_else(|e| panic!("{r}: {}", e.render()));
        let plan = loaded.plan();
        nasos_init::graph::check(&plan.services).unwrap_or_else(|e| panic!("{r}: {e}"));
        let names: Vec<&str> = plan.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.first(), Some(&"console"), "{r}: {names:?}");
        assert!(names.contains(&"modules") && names.contains(&"bless"), "{r}: {names:?}");
        // The plan's order is a valid start order: every dependency comes earlier.
        for (i, s) in plan.services.iter().enumerate() {
            for a in &s.after {
                assert!(names[..i].contains(&a.as_str()), "{r}: {} comes before its dependency {a}", s.name);
            }
        }
    }
}
