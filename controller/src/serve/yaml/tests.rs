//! Tests of the manifest reader and the file set.
#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn parses_multi_document_files_and_names_bad_fields() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n---\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n";
    let objs = parse(Path::new("f.yaml"), text).unwrap().objects;
    assert_eq!(objs.len(), 1);
    let Object::Service(s) = &objs[0] else {
        panic!("not a service")
    };
    assert_eq!(s.metadata.namespace.as_deref(), Some("default"));

    let bad = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {ports: [{port: eighty}]}\n";
    let e = parse(Path::new("f.yaml"), bad).unwrap_err();
    assert_eq!(e.doc, 2);
    assert_eq!(e.field, "spec.ports[0].port");
    assert!(
        e.to_string()
            .starts_with("f.yaml: document 2: spec.ports[0].port:"),
        "{e}"
    );

    let syntax = parse(Path::new("f.yaml"), "kind: [unclosed").unwrap_err();
    assert!(syntax.message.starts_with("YAML:"), "{syntax}");
    let noname = parse(
        Path::new("f.yaml"),
        "apiVersion: v1\nkind: Secret\nmetadata: {}\n",
    )
    .unwrap_err();
    assert_eq!(noname.field, "metadata.name");
    let oldapi = parse(
        Path::new("f.yaml"),
        "apiVersion: extensions/v1beta1\nkind: Ingress\nmetadata: {name: x}\n",
    )
    .unwrap_err();
    assert_eq!(oldapi.field, "apiVersion");
}

#[test]
fn unknown_fields_are_warnings_with_their_paths() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a, creationTimestamp: null}\nspec: {ports: [{port: 80, portz: 81}], bogusField: 1}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: s, namespace: n}\n  typo: x\n";
    let parsed = parse(Path::new("f.yaml"), text).unwrap();
    assert_eq!(parsed.objects.len(), 2, "unknown fields do not reject");
    let got: Vec<String> = parsed.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(
        got[0].starts_with("f.yaml: document 1: spec.bogusField: Service default/a: unknown field"),
        "{got:#?}"
    );
    assert!(got[1].starts_with("f.yaml: document 1: spec.ports[0].portz: Service default/a:"));
    assert!(got[2].starts_with("f.yaml: document 2: items[0].typo: Secret n/s:"));
    // Null values (kubectl's `creationTimestamp: null`) are not unknown fields.
    assert!(!got.iter().any(|g| g.contains("creationTimestamp")));
}

#[test]
fn gateway_api_documents_warn_of_their_typos_only() {
    let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec: {gatewayClassName: c, listeners: [{name: http, port: 80, protocol: HTTP}]}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\nspec: {parentRefs: [{name: g}], rulez: []}\n---\napiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: rg}\nspec: {from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: a}], to: [{group: '', kind: Service}]}\n";
    let parsed = parse(Path::new("g.yaml"), text).unwrap();
    assert_eq!(parsed.objects.len(), 3);
    let got: Vec<String> = parsed.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        got.len(),
        1,
        "apiVersion and kind are not unknown: {got:#?}"
    );
    assert!(got[0].contains("spec.rulez"), "{got:#?}");
}

#[test]
fn a_set_remembers_what_is_wrong_until_the_file_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (dir.path().join("good.yaml"), dir.path().join("bad.yaml"));
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n";
    std::fs::write(&good, svc).unwrap();
    std::fs::write(&bad, "kind: [unclosed").unwrap();
    let roots = [dir.path().to_path_buf()];
    let mut set = YamlSet::new();
    let r = set.reload(&roots).unwrap();
    assert_eq!((r.parsed, r.errors.len()), (1, 1));
    assert_eq!(set.problems().len(), 1);
    // Another file changes: the bad file is not re-read (unchanged), but is still wrong.
    std::fs::write(&good, svc.replace("port: 80}", "port: 80, portz: 1}")).unwrap();
    let r = set.reload(&roots).unwrap();
    assert_eq!((r.parsed, r.errors.len(), r.warnings.len()), (1, 0, 1));
    let problems: Vec<String> = set.problems().iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("bad.yaml: document 1: -: YAML:"),
        "{problems:#?}"
    );
    assert!(problems[1].contains("good.yaml: document 1: spec.ports[0].portz:"));
    // Fixing both clears both; removing a file clears its problems too.
    std::fs::write(&bad, svc.replace("name: a", "name: b")).unwrap();
    std::fs::write(&good, svc).unwrap();
    set.reload(&roots).unwrap();
    assert!(set.problems().is_empty(), "{:?}", set.problems());
    std::fs::write(&bad, "kind: [unclosed").unwrap();
    set.reload(&roots).unwrap();
    assert_eq!(set.problems().len(), 1);
    std::fs::remove_file(&bad).unwrap();
    set.reload(&roots).unwrap();
    assert!(set.problems().is_empty());
    assert_eq!(set.world().services.len(), 1);
}

/// What changed decides the path: EndpointSlices alone (changed, added or removed) name
/// their Services for the endpoints fast path; anything else needs a full translation.
#[test]
fn a_reload_says_whether_only_endpoint_slices_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (svc, eps) = (dir.path().join("svc.yaml"), dir.path().join("eps.yaml"));
    let slice = |ip: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: shop\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{{addresses: [\"{ip}\"]}}]\n"
        )
    };
    std::fs::write(&svc, "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}]}\n").unwrap();
    std::fs::write(&eps, slice("10.0.0.1")).unwrap();
    let roots = [dir.path().to_path_buf()];
    let mut set = YamlSet::new();
    assert!(
        !set.reload(&roots).unwrap().slices_only,
        "the first load has a Service"
    );
    std::fs::write(&eps, slice("10.0.0.2")).unwrap();
    let r = set.reload(&roots).unwrap();
    assert!(r.slices_only);
    assert_eq!(
        r.touched_services.into_iter().collect::<Vec<_>>(),
        [("shop".to_string(), "web".to_string())]
    );
    let r = set.reload(&roots).unwrap();
    assert!(r.touched_services.is_empty(), "nothing changed");
    std::fs::remove_file(&eps).unwrap();
    let r = set.reload(&roots).unwrap();
    assert!(
        r.slices_only && r.touched_services.len() == 1,
        "a removed slice file"
    );
    std::fs::write(&svc, "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 8080}]}\n").unwrap();
    assert!(!set.reload(&roots).unwrap().slices_only);
}

/// A file whose metadata did not change is not read again, unless it changed within the
/// last second, where a same-length rewrite could share its modification time.
#[test]
fn unchanged_files_are_not_read_but_recent_writes_always_are() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("svc.yaml");
    let svc = |port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: a}}\nspec: {{ports: [{{port: {port}}}]}}\n"
        )
    };
    let roots = [dir.path().to_path_buf()];
    let mut set = YamlSet::new();
    // Two writes of the same length in quick succession: both are seen.
    std::fs::write(&f, svc(80)).unwrap();
    assert_eq!(set.reload(&roots).unwrap().parsed, 1);
    std::fs::write(&f, svc(81)).unwrap();
    assert_eq!(
        set.reload(&roots).unwrap().parsed,
        1,
        "a racy rewrite is read"
    );
    // An old file is skipped by its stamp: even a swapped content with the same length and
    // modification time (which no editor produces) is not read.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    let age = || {
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old)
            .unwrap()
    };
    age();
    set.reload(&roots).unwrap();
    std::fs::write(&f, svc(82)).unwrap();
    age();
    assert_eq!(set.reload(&roots).unwrap().parsed, 0);
    // Any real write moves the modification time: read again.
    std::fs::write(&f, svc(83)).unwrap();
    assert_eq!(set.reload(&roots).unwrap().parsed, 1);
}

/// The world a set keeps across reloads is the world built from scratch from the same files,
/// whatever moved: objects moving between files in either order, a name two files hold (the
/// later file wins, and the earlier one's shows again when the later lets go), a file gone,
/// a file that stops parsing (its last good objects stay).
#[test]
fn the_kept_world_is_the_world_built_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let paths = vec![dir.path().to_path_buf()];
    let svc = |name: &str, port: u16| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{port: {port}}}]}}\n"
        )
    };
    let write = |file: &str, text: String| std::fs::write(dir.path().join(file), text).unwrap();
    let mut kept = YamlSet::new();
    let check = |kept: &mut YamlSet, step: &str| {
        kept.reload(&paths).unwrap();
        let mut fresh = YamlSet::new();
        fresh.reload(&paths).unwrap();
        // A fresh set never saw an unreadable file's last good version.
        if !step.contains("unreadable") {
            let (k, f) = (
                format!("{:?}", kept.world()),
                format!("{:?}", fresh.world()),
            );
            assert_eq!(k, f, "{step}");
        }
        kept.world()
            .services
            .iter()
            .map(|((_, n), s)| {
                let port = s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port;
                format!("{n}:{port}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    write("a.yaml", svc("x", 1) + &svc("y", 1));
    write("b.yaml", svc("z", 1));
    assert_eq!(check(&mut kept, "start"), "x:1 y:1 z:1");
    write("a.yaml", svc("x", 1));
    write("b.yaml", svc("z", 1) + &svc("y", 2));
    assert_eq!(check(&mut kept, "y moves to the later file"), "x:1 y:2 z:1");
    write("a.yaml", svc("x", 1) + &svc("y", 3));
    write("b.yaml", svc("z", 1));
    assert_eq!(check(&mut kept, "y moves back"), "x:1 y:3 z:1");
    write("b.yaml", svc("z", 1) + &svc("x", 9));
    assert_eq!(check(&mut kept, "b also holds x"), "x:9 y:3 z:1");
    write("b.yaml", svc("z", 2));
    assert_eq!(check(&mut kept, "b lets x go"), "x:1 y:3 z:2");
    write("b.yaml", "kind: [unclosed".into());
    assert_eq!(check(&mut kept, "b unreadable"), "x:1 y:3 z:2");
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    assert_eq!(check(&mut kept, "b gone"), "x:1 y:3");
    write("a.yaml", svc("x", 4) + &svc("x", 5));
    assert_eq!(check(&mut kept, "a names x twice"), "x:5");
}
