//! The backend traits' promises: a missing group is one clear error; each backend offers the
//! groups its capabilities describe; and no trait method or backend method exists to refuse
//! (checked in the sources, so that a refusal cannot come back unnoticed).

use super::*;
use crate::backend::HostBackend;
use crate::error::ResultCode;

fn host() -> Arc<dyn DeviceBackend> {
    Arc::new(HostBackend::with_devices(2))
}

#[test]
fn a_missing_group_is_one_error_naming_the_backend_the_operation_and_the_group() {
    let b = host();
    let checks: [(Result<()>, &str, &str); 3] = [
        (b.kernels_or_err("launch_exec").map(|_| ()), "launch_exec", "device kernels"),
        (b.symmetric_kernels_or_err("symmetric collective").map(|_| ()), "symmetric collective", "symmetric kernels"),
        (b.buffer_sharing_or_err("zero-copy receive").map(|_| ()), "zero-copy receive", "zero-copy point-to-point"),
    ];
    for (r, what, group) in checks {
        let e = r.expect_err(what);
        assert_eq!(e.code, ResultCode::InvalidUsage, "{}", e.message);
        assert!(e.message.starts_with(what), "{}", e.message);
        assert!(e.message.contains("the host backend has no") && e.message.contains(group), "{}", e.message);
    }
    // What the host backend has, it gives.
    assert!(b.window_memory_or_err("window registration").is_ok());
    let p = b.alloc(0, 64).unwrap();
    let host = b.host_access_or_err("buffers").unwrap();
    assert!(host.host_address(p, 64).unwrap() != 0);
    assert_eq!(host.host_address(p, 65).unwrap_err().code, ResultCode::InvalidArgument);
    b.free(p).unwrap();
}

/// The host backend's groups agree with its capabilities: host-addressable memory is host
/// access; collectives on CPU threads, no kernels; windows through window memory (the CPU
/// runs the symmetric collectives).
#[test]
fn the_host_backend_offers_the_groups_its_capabilities_describe() {
    let b = host();
    let caps = b.capabilities();
    assert_eq!(b.host_access().is_some(), caps.host_addressable);
    assert!(b.kernels().is_none() && b.symmetric_kernels().is_none() && b.buffer_sharing().is_none());
    assert_eq!(b.window_memory().is_some(), caps.symmetric_kernels);
    assert!(caps.virtual_devices && !caps.cuda_handles);
    // Window memory is shareable memory: a window can be made of it.
    let w = b.window_memory().unwrap();
    let p = w.alloc_symmetric(1, 8192).unwrap();
    let m = w.symmetric_memory(p.offset(4096)).unwrap();
    assert_eq!((m.base, m.bytes), (p, 8192));
    b.free(p).unwrap();
}

/// The groups of the GPU backends, on the machines that have them (a clear error elsewhere is
/// the backends' own tests').
#[test]
fn gpu_backends_offer_the_groups_their_capabilities_describe() {
    if let Ok(b) = crate::backend::CudaBackend::shared() {
        let b: &dyn DeviceBackend = &*b;
        assert!(b.kernels().is_some() && b.symmetric_kernels().is_some() && b.window_memory().is_some());
        assert!(b.buffer_sharing().is_some() && b.host_access().is_none());
        assert!(b.capabilities().cuda_handles && !b.capabilities().virtual_devices);
    }
    if let Ok(b) = crate::backend::HipBackend::shared() {
        let b: &dyn DeviceBackend = &*b;
        assert!(b.kernels().is_some() && b.host_access().is_none());
        assert_eq!(b.symmetric_kernels().is_some(), b.capabilities().symmetric_kernels);
        assert!(!b.capabilities().cuda_handles && !b.capabilities().virtual_devices);
    }
    let (gpu, amd) = (crate::backend::caps::gpu_static(), crate::backend::caps::gpu_amd_static());
    assert!(!gpu.host_addressable && gpu.cuda_handles && !amd.cuda_handles && !amd.virtual_devices);
}

/// The traits a backend is made of.
const TRAITS: [&str; 9] =
    ["DeviceBackend", "Memory", "Streams", "Sharing", "Kernels", "SymmetricKernels", "WindowMemory", "BufferSharing", "HostAccess"];

/// Every file under `host/src/backend`, with its path there.
fn backend_sources() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend"), &mut out);
    out
}

/// `src` with comments, string and character literals blanked (same length, newlines
/// kept), so that braces and words in them are not code.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        let end = if c[i] == '/' && next == Some('/') {
            c[i..].iter().position(|&x| x == '\n').map_or(c.len(), |n| i + n)
        } else if c[i] == '/' && next == Some('*') {
            (i + 2..c.len()).find(|&j| c[j - 1] == '*' && c[j] == '/' && j > i + 2).map_or(c.len(), |j| j + 1)
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && (i == 0 || !c[i - 1].is_alphanumeric() && c[i - 1] != '_') {
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let rest: String = c[i + 2 + hashes..].iter().collect();
            rest.find(&close).map_or(c.len(), |n| i + 2 + hashes + rest[..n].chars().count() + close.len())
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if c[i] == '\'' && (c.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            (i + 1..c.len()).find(|&j| c[j] == '\'' && (j > i + 2 || c[i + 1] != '\\')).map_or(c.len(), |j| j + 1)
        } else {
            i += 1;
            continue;
        };
        blank(&mut out, i, end.min(c.len()));
        i = end;
    }
    out.into_iter().collect()
}

/// The index of the `}` closing the `{` at `open`.
fn closing(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, ch) in code[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces");
}

/// The methods with a body directly inside the block `code[open..=close]`: (name, body).
fn methods(code: &str, open: usize, close: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut at = open + 1;
    while let Some(n) = code[at..close].find("fn ") {
        let start = at + n;
        let name: String = code[start + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // The body starts at the first `{` before any `;` (a method without one ends there).
        let rest = &code[start..close];
        let (brace, semi) = (rest.find('{'), rest.find(';'));
        match (brace, semi) {
            (Some(b), s) if s.is_none_or(|s| b < s) => {
                let body_open = start + b;
                let body_close = closing(code, body_open);
                out.push((name, code[body_open + 1..body_close].trim().to_string()));
                at = body_close + 1;
            }
            (_, Some(s)) => at = start + s + 1,
            _ => break,
        }
    }
    out
}

/// The blocks `trait NAME ... { }` and `impl ...NAME for TYPE { }` of the backend traits in
/// `code`: (what, the block's braces).
fn blocks(code: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for name in TRAITS {
        let mut at = 0;
        while let Some(n) = code[at..].find(name) {
            let i = at + n;
            at = i + name.len();
            let word_before = code[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
            let word_after = code[at..].chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_');
            if word_before || word_after {
                continue;
            }
            let line_start = code[..i].rfind('\n').map_or(0, |n| n + 1);
            let head = code[line_start..i].trim();
            let is_trait = head == "pub trait" || head == "trait";
            let is_impl = (head == "impl" || head.starts_with("impl ") && head.ends_with("::")) && code[at..].trim_start().starts_with("for ");
            if !(is_trait || is_impl) {
                continue;
            }
            let open = at + code[at..].find('{').expect("a block");
            let what = code[line_start..open].trim().to_string();
            out.push((what, open, closing(code, open)));
        }
    }
    out
}

/// No default method of the traits refuses, and no backend's implementation of them is a
/// refusal (a body that is only an error): a backend without a group does not implement it.
#[test]
fn no_backend_trait_method_exists_to_refuse() {
    let mut found = Vec::new();
    let mut traits_seen = std::collections::BTreeSet::new();
    for (path, src) in backend_sources() {
        let code = code_only(&src);
        for (what, open, close) in blocks(&code) {
            let is_trait = what.contains("trait ");
            if is_trait {
                let name = what.split("trait ").nth(1).unwrap_or_default();
                traits_seen.insert(name.split(|c: char| !c.is_alphanumeric()).next().unwrap_or_default().to_string());
            }
            for (method, body) in methods(&code, open, close) {
                let refuses = if is_trait { body.contains("Err(") } else { body.starts_with("Err(") };
                if refuses {
                    found.push(format!("{path}: `{what}`: {method} {}", if is_trait { "refuses by default" } else { "is a refusal" }));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "methods that exist only to refuse (a backend without a group returns None from its accessor instead; \
         callers ask with the _or_err helpers):\n{}",
        found.join("\n")
    );
    assert_eq!(traits_seen.len(), TRAITS.len(), "the scan found these of the traits: {traits_seen:?}");
}

#[test]
fn the_source_scan_sees_through_comments_and_literals() {
    let code = code_only("let s = \"{ }\"; // {\nlet c = '{'; let r = r#\"}\"#; fn f<'a>(x: &'a u8) { Err(()) }");
    assert_eq!(code.matches('{').count(), 1, "{code}");
    assert_eq!(code.matches('}').count(), 1, "{code}");
    let src = "trait Kernels { fn a(&self) -> R { Err(e) } fn b(&self); }\nimpl Kernels for X { fn b(&self) { Err(e) } }";
    let code = code_only(src);
    let b = blocks(&code);
    assert_eq!(b.len(), 2, "{b:?}");
    let m = methods(&code, b[0].1, b[0].2);
    assert_eq!(m, vec![("a".to_string(), "Err(e)".to_string())]);
}
