//! Checks of the service graph a plan carries, before nasinit starts anything from it.

use std::collections::{HashMap, HashSet};

use nasos_board::plan::Service;

/// Names are unique, dependencies exist, commands are absolute, and there is no cycle.
pub fn check(services: &[Service]) -> Result<(), String> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, s) in services.iter().enumerate() {
        if s.name.is_empty() || s.name.contains('/') || s.name.starts_with('.') {
            return Err(format!("invalid service name `{}`", s.name));
        }
        if index.insert(&s.name, i).is_some() {
            return Err(format!("two services are named `{}`", s.name));
        }
        match s.command.first() {
            Some(p) if p.starts_with('/') => {}
            _ => return Err(format!("service `{}` needs a command with an absolute path", s.name)),
        }
    }
    for s in services {
        for a in &s.after {
            if !index.contains_key(a.as_str()) {
                return Err(format!("service `{}` comes after `{a}`, which does not exist", s.name));
            }
        }
    }
    // Depth-first search for a cycle.
    fn visit<'a>(
        n: &'a str,
        services: &'a [Service],
        index: &HashMap<&str, usize>,
        on_path: &mut Vec<&'a str>,
        done: &mut HashSet<&'a str>,
    ) -> Result<(), String> {
        if done.contains(n) {
            return Ok(());
        }
        if let Some(pos) = on_path.iter().position(|x| *x == n) {
            let mut cycle = on_path[pos..].to_vec();
            cycle.push(n);
            return Err(format!("dependency cycle: {}", cycle.join(" → ")));
        }
        on_path.push(n);
        if let Some(&i) = index.get(n) {
            for a in &services[i].after {
                visit(a, services, index, on_path, done)?;
            }
        }
        on_path.pop();
        done.insert(n);
        Ok(())
    }
    let mut done = HashSet::new();
    for s in services {
        visit(&s.name, services, &index, &mut Vec::new(), &mut done)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasos_board::plan::{Readiness, Restart, RestartPolicy};

    fn svc(name: &str, after: &[&str]) -> Service {
        Service {
            name: name.into(),
            command: vec!["/bin/true".into()],
            after: after.iter().map(|s| s.to_string()).collect(),
            readiness: Readiness::Started,
            restart: RestartPolicy {
                when: Restart::Never,
                backoff_initial_ms: 0,
                backoff_max_ms: 0,
                start_limit: 1,
                start_limit_window_ms: 1,
            },
            stop_command: None,
            stop_timeout_ms: 1,
            start_timeout_ms: None,
            environment: Default::default(),
            user: None,
            working_directory: None,
            boot_nice: 0,
        }
    }

    #[test]
    fn graphs() {
        assert!(check(&[svc("a", &[]), svc("b", &["a"])]).is_ok());
        assert_eq!(check(&[svc("a", &["b"]), svc("b", &["a"])]), Err("dependency cycle: a → b → a".into()));
        assert!(check(&[svc("a", &["zz"])]).expect_err("invalid").contains("does not exist"));
        assert!(check(&[svc("a", &[]), svc("a", &[])]).expect_err("invalid").contains("two services"));
        let mut rel = svc("r", &[]);
        rel.command = vec!["true".into()];
        assert!(check(&[rel]).expect_err("invalid").contains("absolute"));
    }
}
