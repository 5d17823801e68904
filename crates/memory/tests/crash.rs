//! Kill a writer with SIGKILL at random moments, at least 50 times, and
//! check after each kill that the file reopens, verifies clean and holds a
//! prefix of the deterministic history that includes every block the
//! writer had reported committed.
//!
//! The writer is this test binary again, running [`crash_child`] with
//! `MEMORY_CRASH_CHILD` set: it opens (or creates) the file, cuts whatever
//! torn tail the last kill left, appends block `i` of the deterministic
//! stream for i = len, len + 1, ..., commits every 3 blocks and prints
//! `committed N` after each commit returns.

use memory::synth::{nth_block, Rng};
use memory::{verify, Geometry, MemoryFile, Mode};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const SEED: u64 = 0xc0ffee;
const FP: [u8; 32] = [3; 32];
const KILLS: usize = 60;

fn geometry() -> Geometry {
    Geometry {
        block_tokens: 16,
        slots: 4,
        code_bytes: 8,
        extra_bytes: 2,
        id_bytes: 2,
    }
}

#[test]
fn crash_child() {
    let Some(path) = std::env::var_os("MEMORY_CRASH_CHILD") else {
        return;
    };
    let path = Path::new(&path);
    let g = geometry();
    let mut mf = if path.exists() {
        MemoryFile::open(path, Some(&FP), Mode::Write).unwrap()
    } else {
        MemoryFile::create(path, FP, g, b"crash test").unwrap()
    };
    let mut i = mf.len_blocks();
    // Bounded: a child nobody kills stops on its own.
    while i < 50_000 {
        mf.append(&nth_block(SEED, &g, i).as_in()).unwrap();
        i += 1;
        if i % 3 == 0 {
            mf.commit().unwrap();
            println!("committed {i}");
        }
    }
}

#[test]
fn sigkill_at_random_moments_leaves_a_clean_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.mem");
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng::new(42);
    let mut committed = 0u64;
    let mut grew = 0;
    let (mut tails, mut past_commit, mut from_index_file) = (0, 0, 0);
    for kill in 0..KILLS {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("MEMORY_CRASH_CHILD", &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("committed ") {
                    last = n.trim().parse().unwrap();
                }
            }
            last
        });
        // From before the child has opened the file to well into appending.
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let reported = reader.join().unwrap();
        assert!(
            status.code().is_none() || status.success(),
            "kill {kill}: the writer failed on its own ({status})"
        );
        committed = committed.max(reported);

        let rep = verify(&path);
        if !path.exists() {
            // Killed before creation finished: nothing may be left behind
            // under the real name.
            assert_eq!(committed, 0);
            continue;
        }
        let rep = rep.unwrap();
        assert!(rep.is_clean(), "kill {kill}: {:?}", rep.problems);
        let mf = MemoryFile::open(&path, Some(&FP), Mode::Write)
            .unwrap_or_else(|e| panic!("kill {kill}: {e}"));
        tails += (mf.open_report().tail_bytes > 0) as usize;
        from_index_file += mf.open_report().from_index_file;
        past_commit += (mf.len_blocks() > reported) as usize;
        assert!(
            mf.len_blocks() >= committed,
            "kill {kill}: {} blocks after {committed} were committed",
            mf.len_blocks()
        );
        for i in 0..mf.len_blocks() {
            let b = mf.read_block(i).unwrap();
            assert!(
                nth_block(SEED, &geometry(), i).matches(&b),
                "kill {kill}: block {i} differs"
            );
        }
        if mf.len_blocks() > 0 {
            grew += 1;
        }
        let rep = verify(&path).unwrap();
        assert!(
            rep.is_clean() && !rep.notes.iter().any(|n| n.contains("torn")),
            "kill {kill} after the writer's open: {rep:?}"
        );
    }
    eprintln!(
        "{KILLS} kills: {committed} blocks committed at most, torn tails cut after {tails} kills, \
         blocks past the last reported commit after {past_commit}, \
         {from_index_file} block entries read from index files"
    );
    assert!(
        committed > 0,
        "no writer ever committed: the kills came too early"
    );
    assert!(grew > KILLS / 2);
    // No temporary creation file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.contains("creating")), "{names:?}");
}

/// Child for [`a_real_write_error_cuts_back_and_the_file_opens`]: appends
/// under a file-size limit until the kernel refuses a write.
#[test]
fn full_child() {
    let Some(path) = std::env::var_os("MEMORY_FULL_CHILD") else {
        return;
    };
    let path = Path::new(&path);
    let g = geometry();
    let mut mf = MemoryFile::create(path, FP, g, b"").unwrap();
    let mut i = 0;
    loop {
        let r = mf.append(&nth_block(SEED, &g, i).as_in()).and_then(|_| {
            i += 1;
            if i % 3 == 0 {
                mf.commit()?;
                println!("committed {i}");
            }
            Ok(())
        });
        if let Err(e) = r {
            println!("error: {e}");
            println!("blocks after the error {}", mf.len_blocks());
            return;
        }
        assert!(i < 100_000, "the size limit never hit");
    }
}

/// A real write error from the kernel (EFBIG under `ulimit -f`, the same
/// path as ENOSPC): the error is clear, the writer's file is cut back to the
/// last commit, and the file opens and verifies clean.
#[test]
fn a_real_write_error_cuts_back_and_the_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.mem");
    let exe = std::env::current_exe().unwrap();
    // SIGXFSZ ignored, so an over-limit write fails with EFBIG instead of
    // killing the writer. The limit is in 1 KiB units (bash) or 512-byte
    // units (POSIX sh): either way a few dozen records.
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 64; exec \"$0\" full_child --exact --nocapture --test-threads=1")
        .arg(&exe)
        .env("MEMORY_FULL_CHILD", &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let error = stdout
        .lines()
        .find(|l| l.starts_with("error: "))
        .expect("no write error");
    assert!(
        error.contains("File too large") && error.contains("still opens"),
        "{error}"
    );
    let committed: u64 = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("committed "))
        .unwrap()
        .parse()
        .unwrap();
    let after: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("blocks after the error "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        after, committed,
        "the writer dropped what was not committed"
    );
    let rep = verify(&path).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    let mf = MemoryFile::open(&path, Some(&FP), Mode::Write).unwrap();
    assert_eq!(mf.len_blocks(), committed);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), mf.file_bytes());
    for i in 0..committed {
        assert!(nth_block(SEED, &geometry(), i).matches(&mf.read_block(i).unwrap()));
    }
}
