//! ptxas' verbose report (NVRTC option [`VERBOSE_OPTION`]), read into numbers: registers per
//! thread, spill stores and loads, stack frame, for each function of a compile.
//!
//! The report is the program log of a successful compile. For NVRTC 13 targeting `sm_90` it
//! reads (one block per function; entry functions have the `Compiling entry function` and
//! `Used ... registers` lines, device functions that were not inlined only the properties):
//!
//! ```text
//! ptxas info    : 0 bytes gmem
//! ptxas info    : Compiling entry function 'spilly' for 'sm_90'
//! ptxas info    : Function properties for spilly
//! ptxas         .     640 bytes stack frame, 592 bytes spill stores, 692 bytes spill loads
//! ptxas info    : Used 24 registers, used 0 barriers, 640 bytes cumulative stack size
//! ptxas info    : Compile time = 48.279 ms
//! ptxas info    : Function properties for _Z6helperPfi
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ```
//!
//! Older ptxas versions also print `N bytes lmem` and `N bytes cmem[K]` on the `Used` line;
//! `lmem` is read as local memory, the rest of that line is ignored.

/// The NVRTC option that makes ptxas write its report into the program log.
pub const VERBOSE_OPTION: &str = "--ptxas-options=--verbose";

/// What ptxas reports for one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionReport {
    /// The (mangled) name ptxas prints.
    pub name: String,
    /// A kernel (`Compiling entry function`), not a device function.
    pub entry: bool,
    /// Registers per thread (`Used N registers`); `None` where ptxas printed no such line
    /// (device functions).
    pub registers: Option<u32>,
    /// Bytes of stack frame per thread.
    pub stack_frame: u64,
    pub spill_stores: u64,
    pub spill_loads: u64,
    /// `N bytes cumulative stack size` (the kernel's stack with its callees'), 0 when absent.
    pub cumulative_stack: u64,
    /// `N bytes lmem` (older ptxas), 0 when absent.
    pub lmem: u64,
}

impl FunctionReport {
    /// Whether the function uses no local memory at all: no spills, no stack frame (so no
    /// local arrays), none for its callees.
    pub fn no_local_memory(&self) -> bool {
        self.stack_frame == 0
            && self.spill_stores == 0
            && self.spill_loads == 0
            && self.cumulative_stack == 0
            && self.lmem == 0
    }
}

/// The functions of a ptxas report, in the order it names them. Lines that are not part of
/// the report (NVRTC's own warnings) are skipped.
pub fn parse(log: &str) -> Vec<FunctionReport> {
    let mut out: Vec<FunctionReport> = Vec::new();
    let mut entries: Vec<String> = Vec::new();
    // The function the following property and `Used` lines describe.
    let mut current: Option<usize> = None;
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("ptxas") else {
            continue;
        };
        let body = rest.trim_start().trim_start_matches("info").trim_start().trim_start_matches(':').trim();
        if let Some(name) = body.strip_prefix("Compiling entry function ") {
            entries.push(quoted(name).to_string());
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            let name = name.trim().to_string();
            let entry = entries.contains(&name);
            out.push(FunctionReport { name, entry, ..FunctionReport::default() });
            current = Some(out.len() - 1);
        } else if let Some(props) = body.strip_prefix('.') {
            if let Some(f) = current.map(|i| &mut out[i]) {
                for (n, what) in counts(props) {
                    match what {
                        "bytes stack frame" => f.stack_frame = n,
                        "bytes spill stores" => f.spill_stores = n,
                        "bytes spill loads" => f.spill_loads = n,
                        _ => {}
                    }
                }
            }
        } else if let Some(used) = body.strip_prefix("Used ") {
            if let Some(f) = current.map(|i| &mut out[i]) {
                for (n, what) in counts(used) {
                    match what {
                        "registers" => f.registers = Some(n as u32),
                        "bytes cumulative stack size" => f.cumulative_stack = n,
                        "bytes lmem" => f.lmem = n,
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

/// The text between the first pair of single quotes (`'name' for 'sm_90'` → `name`), or all
/// of it when there are none.
fn quoted(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('\'').and_then(|r| r.split('\'').next()).unwrap_or(s)
}

/// `640 bytes stack frame, 592 bytes spill stores` → `[(640, "bytes stack frame"), ...]`, and
/// `24 registers, used 0 barriers` → `[(24, "registers"), (0, "barriers")]`: each
/// comma-separated item's first number and the words after it.
fn counts(s: &str) -> Vec<(u64, &str)> {
    s.split(',')
        .filter_map(|item| {
            let item = item.trim();
            let item = item.strip_prefix("used ").unwrap_or(item);
            let (n, what) = item.split_once(' ')?;
            Some((n.parse().ok()?, what.trim()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from NVRTC 13.0 (`--ptxas-options=--verbose`, sm_90, `-maxrregcount=24` to
    /// force spills in `spilly`).
    const NVRTC_13_LOG: &str = "\
ptxas info    : Overriding maximum register limit 256 for 'plain' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'spilly' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'plain' for 'sm_90'
ptxas info    : Function properties for plain
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 1 barriers
ptxas info    : Compile time = 11.712 ms
ptxas info    : Compiling entry function 'spilly' for 'sm_90'
ptxas info    : Function properties for spilly
ptxas         .     640 bytes stack frame, 592 bytes spill stores, 692 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 640 bytes cumulative stack size
ptxas info    : Compile time = 48.279 ms
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    #[test]
    fn reads_the_nvrtc_13_report() {
        let fns = parse(NVRTC_13_LOG);
        assert_eq!(
            fns,
            vec![
                FunctionReport {
                    name: "plain".into(),
                    entry: true,
                    registers: Some(8),
                    ..FunctionReport::default()
                },
                FunctionReport {
                    name: "spilly".into(),
                    entry: true,
                    registers: Some(24),
                    stack_frame: 640,
                    spill_stores: 592,
                    spill_loads: 692,
                    cumulative_stack: 640,
                    lmem: 0,
                },
                FunctionReport { name: "_Z6helperPfi".into(), ..FunctionReport::default() },
            ]
        );
        assert!(fns[0].no_local_memory());
        assert!(!fns[1].no_local_memory());
        assert!(fns[2].no_local_memory());
    }

    /// The older `Used` line (registers, lmem, cmem) and a log with no report at all.
    #[test]
    fn reads_lmem_and_ignores_other_lines() {
        let log = "\
warning: something NVRTC said
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 16 bytes lmem, 368 bytes cmem[0]
";
        let fns = parse(log);
        assert_eq!(fns.len(), 1);
        assert_eq!((fns[0].registers, fns[0].stack_frame, fns[0].lmem), (Some(40), 16, 16));
        assert!(fns[0].entry);
        assert!(!fns[0].no_local_memory());
        assert!(parse("").is_empty());
        assert!(parse("nvrtc: warning: nothing from ptxas\n").is_empty());
    }
}
