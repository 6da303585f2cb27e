//! Every file of the tuner table's fuzz corpus (`fuzz/corpus/tuner_table/`) through the entry
//! point the fuzz target uses, on stable (see `host/tests/fuzz_corpus.rs` for the others).

use std::path::PathBuf;

#[test]
fn tuner_table() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/tuner_table");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let outcome = std::panic::catch_unwind(|| rustccl_tuner_default::fuzzing::rule_table(&text));
        assert!(outcome.is_ok(), "{} panicked", path.display());
        n += 1;
    }
    assert!(n > 0, "{} holds no corpus files", dir.display());
}
