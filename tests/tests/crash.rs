//! A child process writes with `sync = true` through the wrapper and is
//! SIGKILLed mid-run; reopening finds every key it had acknowledged.
//!
//! The child is this test binary itself, re-run with an environment variable
//! that turns `crash_child` from a no-op into the writer.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocks_env::StagedDb;
use tests::{key, small_lsm_options, value};

const CHILD_DIR: &str = "ROCKS_ENV_CRASH_CHILD_DIR";

/// The writer, when run as the child; a no-op otherwise.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else { return };
    let db = StagedDb::open(small_lsm_options(), dir).expect("child opens the DB");
    let mut sync = rocksdb::WriteOptions::default();
    sync.set_sync(true);
    for i in 0u64.. {
        db.put_opt(key(i), value(i, 300), &sync).expect("child write");
        // Acknowledge only after RocksDB returned: the parent checks these.
        println!("ack {i}");
    }
}

#[test]
fn sigkill_mid_run_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked: Vec<u64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Let it write a few thousand synced keys (several flushes), then kill it.
    while acked.len() < 3_000 {
        assert!(Instant::now() < deadline, "child too slow: {} acks", acked.len());
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(n) = l.strip_prefix("ack ") {
                    acked.push(n.parse().unwrap());
                }
            }
            other => panic!("child stopped early: {other:?}"),
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Acks already in the pipe were given before the kill.
    for l in lines.map_while(Result::ok) {
        if let Some(n) = l.strip_prefix("ack ") {
            acked.push(n.parse().unwrap());
        }
    }

    let db = StagedDb::open(small_lsm_options(), dir.path()).unwrap();
    for &i in &acked {
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&value(i, 300)[..]), "acknowledged key {i} lost");
    }
    eprintln!("{} acknowledged keys survived SIGKILL", acked.len());
}
