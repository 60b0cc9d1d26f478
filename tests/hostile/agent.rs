//! Hostile inputs: agent. Another user plants files where the victim's
//! agent looks: the extracted agent's cache (item 1), the tracker build cache
//! (item 1), the segment name in the sticky segment directory (item 17).
//!
//! The tests plant as root (chown to `nobody`, uid 65534) and, for item 17,
//! run the producer as `nobody` (setpriv) so that the kernel's sticky-bit
//! rule applies to it. Without root, python3 or setpriv they print
//! `SKIPPED: …` and return.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{chown, lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vramscope_collect::agent;
use vramscope_wire::ring::discover::{self, current_uid};
use vramscope_wire::ring::writer::{SegmentConfig, SegmentWriter};
use vramscope_wire::ring::{Producer, SegmentReader};

/// The other user.
const OTHER: u32 = 65534;

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn mkdir(p: &Path, m: u32) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    mode(p, m);
    p.to_path_buf()
}

/// `chown -R uid` (no symbolic links followed).
fn chown_r(p: &Path, uid: u32) {
    lchown(p, Some(uid), Some(uid)).unwrap();
    if std::fs::symlink_metadata(p).unwrap().is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            chown_r(&e.unwrap().path(), uid);
        }
    }
}

/// Root, so that files can be planted as another user.
fn root_or_skip(what: &str) -> bool {
    if current_uid() != 0 {
        println!("SKIPPED: {what}: planting files as another user needs root");
        return false;
    }
    true
}

fn python() -> Option<String> {
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    Command::new(&py)
        .args(["-c", "pass"])
        .status()
        .ok()
        .filter(|s| s.success())
        .map(|_| py)
}

/// `setpriv` arguments that make a command run as the other user.
const AS_OTHER: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups"];

/// A Python the other user can run (the test's own may live under /root).
fn python_for_other() -> Option<String> {
    for py in ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"] {
        let ok = Command::new("setpriv")
            .args(AS_OTHER)
            .args([py, "-c", "import sys; assert sys.version_info >= (3, 8)"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(py.to_string());
        }
    }
    None
}

/// The agent's own lines on stderr.
fn our_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("vramscope:"))
        .collect()
}

/// A tempdir the other user can traverse (for the files it must read).
fn shared_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    mode(t.path(), 0o755);
    t
}

/// The agent's files, readable by everyone, in `dir` (for a producer that
/// runs as the other user; the real extraction is private to its user).
fn write_agent_for_everyone(dir: &Path) {
    for (name, body) in agent::FILES {
        let p = dir.join(name);
        mkdir(p.parent().unwrap(), 0o755);
        std::fs::write(&p, body).unwrap();
        mode(&p, 0o644);
    }
}

/// `body` cut or padded with a comment to `len` bytes.
fn same_size(body: &str, len: usize) -> String {
    assert!(body.len() + 2 <= len, "the planted file must fit");
    let mut s = body.to_string();
    s.push('#');
    while s.len() + 1 < len {
        s.push('x');
    }
    s.push('\n');
    s
}

/// Item 1, as reported: HOME and XDG_CACHE_HOME unset, the cache falls back
/// to `$TMPDIR/vramscope-cache-<uid>`, where another user planted a complete
/// extraction whose `sitecustomize.py` (same size as ours) writes a mark.
/// Neither `vramscope run` nor `vramscope doctor` may run it; the run says in
/// one line that it uses a fresh private copy.
#[test]
fn item_01_planted_cache_file_is_never_run() {
    if !root_or_skip("item 1") {
        return;
    }
    let Some(py) = python() else {
        println!("SKIPPED: item 1: needs python3");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sticky = mkdir(&tmp.path().join("tmp"), 0o1777);
    let mark = tmp.path().join("pwned");
    let planted_root = sticky.join(format!("vramscope-cache-{}", current_uid()));
    let planted = planted_root.join(agent::dir_name());
    for (name, body) in agent::FILES {
        let p = planted.join(name);
        mkdir(p.parent().unwrap(), 0o755);
        let text = if *name == "sitecustomize.py" {
            let evil = format!("open({:?}, 'w').write('pwned')\n", mark.to_str().unwrap());
            same_size(&evil, body.len())
        } else {
            body.to_string()
        };
        assert_eq!(text.len(), body.len());
        std::fs::write(&p, text).unwrap();
    }
    chown_r(&planted_root, OTHER);

    let vramscope = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .env_remove("HOME")
            .env_remove("XDG_CACHE_HOME")
            .env_remove("PYTHONPATH")
            .env("TMPDIR", &sticky)
            .env("VRAMSCOPE_PYTHON", &py)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = vramscope(&["run", &py, "-c", "print('job ran')"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !mark.exists(),
        "vramscope run ran the planted sitecustomize.py"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("job ran"), "{stdout}");
    let ours = our_lines(&stderr);
    assert_eq!(ours.len(), 1, "one line about the cache: {stderr}");
    assert!(
        ours[0].contains("not private") && ours[0].contains("fresh private copy"),
        "{}",
        ours[0]
    );
    // Someone else's files are left alone.
    assert!(planted.join("sitecustomize.py").exists());

    let out = vramscope(&["doctor"]);
    assert!(
        !mark.exists(),
        "vramscope doctor ran the planted sitecustomize.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Item 1, the class: a cache root is used only when private to the user
/// (ours, no symbolic link, writable by no one else, every directory above
/// it owned by root or us and not writable by others unless sticky, links
/// on the way owned by root or us); an extraction inside it only when ours
/// and byte for byte the embedded files.
#[test]
fn item_01_untrusted_cache_roots_are_refused() {
    if !root_or_skip("item 1") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let refused = |root: &Path, why: &str| {
        let e = agent::extract_to(root).expect_err(&format!("{} was trusted", root.display()));
        let msg = format!("{e:#}");
        assert!(msg.contains("not private") && msg.contains(why), "{msg}");
    };
    // Owned by another user.
    let a = mkdir(&t.join("a"), 0o700);
    chown(&a, Some(OTHER), Some(OTHER)).unwrap();
    refused(&a, "owned by uid 65534");
    // Ours, but writable by everyone (or the group).
    refused(&mkdir(&t.join("b"), 0o777), "writable by group or others");
    refused(&mkdir(&t.join("b2"), 0o770), "writable by group or others");
    // A symbolic link (to a private directory of ours).
    let real = mkdir(&t.join("c_real"), 0o700);
    symlink(&real, t.join("c")).unwrap();
    refused(&t.join("c"), "symbolic link");
    // Below a directory of another user.
    let d = mkdir(&t.join("d"), 0o755);
    let d_cache = mkdir(&d.join("cache"), 0o700);
    chown(&d, Some(OTHER), Some(OTHER)).unwrap();
    refused(&d_cache, "owned by uid 65534");
    // Below a non-sticky world-writable directory.
    let e = mkdir(&t.join("e"), 0o777);
    refused(&mkdir(&e.join("cache"), 0o700), "writable by other users");
    // Through a link another user owns, in a sticky directory.
    let sticky = mkdir(&t.join("sticky"), 0o1777);
    let target = mkdir(&t.join("target"), 0o700);
    symlink(&target, sticky.join("link")).unwrap();
    lchown(sticky.join("link"), Some(OTHER), Some(OTHER)).unwrap();
    refused(
        &sticky.join("link/cache"),
        "symbolic link owned by uid 65534",
    );
    // A private root: fine, also through a link of ours and a sticky dir.
    let mine = mkdir(&sticky.join("mine"), 0o700);
    assert!(agent::extract_to(&mine).is_ok());
    symlink(&target, sticky.join("mylink")).unwrap();
    assert!(agent::extract_to(&sticky.join("mylink/cache")).is_ok());

    // An extraction planted inside our own root by another user (same
    // files, same sizes) is not reused: it is replaced by ours.
    let f = mkdir(&t.join("f"), 0o700);
    let planted = f.join(agent::dir_name());
    for (name, body) in agent::FILES {
        let p = planted.join(name);
        mkdir(p.parent().unwrap(), 0o755);
        std::fs::write(&p, body).unwrap();
    }
    chown_r(&planted, OTHER);
    let got = agent::extract_to(&f).unwrap();
    assert_eq!(got, planted);
    assert!(agent::verified(&got));
    assert_eq!(std::fs::metadata(&got).unwrap().uid(), current_uid());
    for (name, _) in agent::FILES {
        assert_eq!(
            std::fs::metadata(got.join(name)).unwrap().uid(),
            current_uid()
        );
    }
}

/// The positive paths: a clean cache is reused as it is (nothing
/// rewritten); a file of ours changed in place (same size), a file made
/// group-writable, or an extra file are replaced by a fresh extraction.
#[test]
fn item_01_clean_cache_is_reused_and_a_tampered_one_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let a = agent::extract_to(tmp.path()).unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let site = a.join("sitecustomize.py");
    let before = (ino(&a), ino(&site));
    let b = agent::extract_to(tmp.path()).unwrap();
    assert_eq!(a, b);
    assert_eq!((ino(&b), ino(&b.join("sitecustomize.py"))), before);
    // Python's byte-code cache does not count as tampering.
    std::fs::write(a.join("vramscope/__pycache__/_build.cpython-311.pyc"), b"x").unwrap();
    assert!(agent::verified(&a));
    assert_eq!(ino(&agent::extract_to(tmp.path()).unwrap()), before.0);

    let body = |name: &str| agent::FILES.iter().find(|(n, _)| *n == name).unwrap().1;
    // Same size, other content.
    let seg = a.join("vramscope/_segment.py");
    let evil = same_size(
        "raise SystemExit('tampered')\n",
        body("vramscope/_segment.py").len(),
    );
    std::fs::write(&seg, evil).unwrap();
    assert!(!agent::verified(&a));
    let c = agent::extract_to(tmp.path()).unwrap();
    assert_eq!(c, a);
    assert_eq!(
        std::fs::read_to_string(&seg).unwrap(),
        body("vramscope/_segment.py")
    );
    assert_ne!(ino(&c), before.0, "a fresh extraction was renamed in");
    // Group-writable.
    mode(&c.join("sitecustomize.py"), 0o664);
    assert!(!agent::verified(&c));
    let d = agent::extract_to(tmp.path()).unwrap();
    assert!(agent::verified(&d));
    // An extra module.
    std::fs::write(d.join("vramscope/extra.py"), "print('extra')\n").unwrap();
    assert!(!agent::verified(&d));
    let e = agent::extract_to(tmp.path()).unwrap();
    assert!(!e.join("vramscope/extra.py").exists());
    // Nothing left behind but the extraction.
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(agent::dir_name())]);
}

const BUILD_SCRIPT: &str = r#"
import json, sys
from vramscope import _build
notes = []
p = _build.build(sys.argv[1], "2.11.0", 1, warn=notes.append)
print(json.dumps({"path": p, "notes": notes, "content": open(p, "rb").read().decode("latin-1")}))
"#;

const FAKE_CXX: &str = r#"#!/bin/sh
echo run >> "$FAKE_CXX_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
printf 'built by the fake compiler\n' > "$out"
"#;

/// Item 1, the tracker build cache: the compiled library is loaded from the
/// cache only when the cache is private and the library is the one we built
/// (its recorded SHA-256). A compiler stand-in counts builds.
#[test]
fn item_01_planted_tracker_library_is_never_loaded() {
    if !root_or_skip("item 1 (tracker cache)") {
        return;
    }
    let Some(py) = python() else {
        println!("SKIPPED: item 1 (tracker cache): needs python3");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let agent_dir = agent::extract_to(&t.join("agent")).unwrap();
    let torch = mkdir(&t.join("fake/torch"), 0o755);
    std::fs::write(torch.join("__init__.py"), "").unwrap();
    let c10 = mkdir(&torch.join("include/c10/cuda"), 0o755);
    std::fs::write(c10.join("CUDACachingAllocator.h"), "").unwrap();
    let cuda = mkdir(&t.join("cuda/crt"), 0o755);
    std::fs::write(cuda.join("host_config.h"), "").unwrap();
    std::fs::write(t.join("cuda/cuda_runtime_api.h"), "").unwrap();
    let cxx = t.join("fakecxx");
    std::fs::write(&cxx, FAKE_CXX).unwrap();
    mode(&cxx, 0o755);
    let log = t.join("cxx.log");
    let script = t.join("build.py");
    std::fs::write(&script, BUILD_SCRIPT).unwrap();
    let private_tmp = mkdir(&t.join("privtmp"), 0o700);
    let build = |xdg: &Path| -> serde_json::Value {
        let out = crate::common::succeeded(
            Command::new(&py)
                .arg(&script)
                .arg(torch.join("__init__.py"))
                .env("PYTHONPATH", &agent_dir)
                .env("VRAMSCOPE_CXX", &cxx)
                .env("VRAMSCOPE_CUDA_INCLUDE", t.join("cuda"))
                .env("FAKE_CXX_LOG", &log)
                .env("XDG_CACHE_HOME", xdg)
                .env("TMPDIR", &private_tmp)
                .env_remove("CUDA_HOME")
                .output()
                .unwrap(),
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let builds = || {
        std::fs::read_to_string(&log)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    const BUILT: &str = "built by the fake compiler\n";

    // Our own cache: built once, then reused; a tampered library rebuilt.
    let own = t.join("own");
    let first = build(&own);
    assert_eq!(builds(), 1);
    assert_eq!(first["content"], BUILT);
    assert_eq!(first["notes"].as_array().unwrap().len(), 0, "{first}");
    let lib = PathBuf::from(first["path"].as_str().unwrap());
    assert!(lib.starts_with(own.join("vramscope")), "{}", lib.display());
    let again = build(&own);
    assert_eq!(builds(), 1, "a clean cached library is reused");
    assert_eq!(again["path"], first["path"]);
    std::fs::write(&lib, same_size("tampered", BUILT.len())).unwrap();
    let rebuilt = build(&own);
    assert_eq!(builds(), 2, "a tampered library is rebuilt");
    assert_eq!(rebuilt["content"], BUILT);
    assert_eq!(std::fs::read_to_string(&lib).unwrap(), BUILT);

    // Another user's cache with a planted library of the right name and a
    // matching digest: never returned; built in a fresh private directory.
    let sticky = mkdir(&t.join("sticky"), 0o1777);
    let evil_xdg = sticky.join("xdg");
    let evil = mkdir(&evil_xdg.join("vramscope"), 0o755).join(lib.file_name().unwrap());
    std::fs::write(&evil, "PLANTED").unwrap();
    let digest = Command::new(&py)
        .args([
            "-c",
            "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
        ])
        .arg(&evil)
        .output()
        .unwrap();
    std::fs::write(evil.with_extension("so.sha256"), &digest.stdout).unwrap();
    chown_r(&evil_xdg, OTHER);
    let got = build(&evil_xdg);
    assert_ne!(got["path"].as_str().unwrap(), evil.to_str().unwrap());
    assert_eq!(got["content"], BUILT, "{got}");
    assert_eq!(builds(), 3);
    let notes = got["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{got}");
    assert!(notes[0].as_str().unwrap().contains("not private"), "{got}");
    assert!(Path::new(got["path"].as_str().unwrap()).starts_with(&private_tmp));
}

/// A fake torch for sampled mode.
const FAKE_TORCH: &str = include_str!("../fixtures/fake_torch.py");

/// A producer of the Python agent, sampled mode.
const JOB: &str = include_str!("../fixtures/sampled_job.py");

/// Runs `argv` as the other user with its pid's segment name in `shm`
/// already taken by a file of root's (planted before the exec, so the pid is
/// the producer's own). Returns (first line of stdout, the rest of stdout
/// and stderr, planted path) after sending it a line and waiting.
fn run_squatted(shm: &Path, argv: &[&str], env: &[(&str, &Path)]) -> (String, String, PathBuf) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(
            "touch \"$1/vramscope-65534-$$\" && shift && \
             exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$@\"",
        )
        .arg("sh")
        .arg(shm)
        .args(argv)
        .env("HOME", "/nonexistent")
        .env_remove("XDG_CACHE_HOME")
        .env("VRAMSCOPE_SHM_DIR", shm)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let planted = shm.join(format!("vramscope-65534-{}", child.id()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().map(|l| l.unwrap()).unwrap_or_default();
    // While it runs: its segment is readable where it says.
    let checked = if first.contains("vramscope-65534-") {
        let path = first
            .split('"')
            .find(|s| s.contains("vramscope-65534-"))
            .unwrap_or(&first)
            .to_string();
        // The reader refuses another user's segment: check what it would
        // (the name parses, tag and all; the header is published, our pid).
        let name = Path::new(&path).file_name().unwrap().to_str().unwrap();
        let parsed = discover::parse_name(name).map(|n| (n.uid, n.pid, n.tag.is_some()));
        let bytes = std::fs::read(&path).unwrap_or_default();
        let word = |at: usize| {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        };
        let published = bytes.get(..8) == Some(&b"VMScope1"[..]);
        format!(
            "reader: {:?}",
            if published
                && parsed == Some((OTHER, child.id(), true))
                && word(24) == Some(child.id())
            {
                Ok(())
            } else {
                Err((parsed, published, word(24)))
            }
        )
    } else {
        String::new()
    };
    let _ = writeln!(child.stdin.as_mut().unwrap());
    let out = child.wait_with_output().unwrap();
    let rest = format!(
        "{checked}\nstatus {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    (first, rest, planted)
}

/// The producer got `vramscope-65534-<pid>-r<10 hex>`, a reader opens it,
/// one warning line says so, and the planted file is untouched.
fn check_tagged(who: &str, first: &str, rest: &str, planted: &Path) {
    let base = planted.file_name().unwrap().to_str().unwrap();
    let tagged = format!("{base}-r");
    assert!(
        first.contains(&tagged),
        "{who}: no tagged segment name: {first}\n{rest}"
    );
    assert!(rest.contains("reader: Ok(())"), "{who}: {rest}");
    let ours = our_lines(rest);
    let lines: Vec<_> = ours.iter().filter(|l| l.contains("is taken")).collect();
    assert_eq!(lines.len(), 1, "{who}: one warning line: {rest}");
    assert!(lines[0].contains(base), "{who}: {}", lines[0]);
    assert!(planted.exists(), "{who}: the planted file was removed");
    assert_eq!(std::fs::metadata(planted).unwrap().uid(), 0);
}

/// Item 17: another user pre-creates `vramscope-<uid>-<pid>` in the sticky
/// segment directory. Every producer (the Python agent's sampled writer and
/// the C header, run as the victim `nobody`; the Rust writer) takes a
/// tagged name instead of giving up, and says so in one line.
#[test]
fn item_17_squatted_segment_name_gets_a_tagged_name() {
    if !root_or_skip("item 17") {
        return;
    }
    let Some(py) = python_for_other() else {
        println!("SKIPPED: item 17: no setpriv, or no python3 the user nobody can run");
        return;
    };
    let tmp = shared_tempdir();
    let t = tmp.path();
    let shm = mkdir(&t.join("shm"), 0o1777);

    // The Python agent, sampled mode.
    let agent_dir = mkdir(&t.join("agent"), 0o755);
    write_agent_for_everyone(&agent_dir);
    let fake = mkdir(&t.join("fake/torch"), 0o755);
    std::fs::write(fake.join("__init__.py"), FAKE_TORCH).unwrap();
    mode(&fake.join("__init__.py"), 0o644);
    let job = t.join("job.py");
    std::fs::write(&job, JOB).unwrap();
    mode(&job, 0o644);
    let pythonpath = PathBuf::from(format!(
        "{}:{}",
        t.join("fake").display(),
        agent_dir.display()
    ));
    let (first, rest, planted) = run_squatted(
        &shm,
        &[&py, "-B", job.to_str().unwrap()],
        &[
            ("PYTHONPATH", &pythonpath),
            ("VRAMSCOPE_MODE", Path::new("sampled")),
        ],
    );
    assert!(
        first.contains("\"sampled\""),
        "python agent: {first}\n{rest}"
    );
    check_tagged("python agent", &first, &rest, &planted);
    assert!(rest.contains("status Some(0)"), "{rest}");

    // The C writer of vramscope_ring.h (the tracker's).
    if crate::c_writer::have_cc() {
        let exe = crate::c_writer::compile(
            "tests/c/holder.c",
            &t.join("writer"),
            &["cc", "-std=gnu11"],
            &[],
        );
        mode(&exe, 0o755);
        let (first, rest, planted) = run_squatted(&shm, &[exe.to_str().unwrap()], &[]);
        check_tagged("C writer", &first, &rest, &planted);
        assert!(rest.contains("status Some(0)"), "{rest}");
    } else {
        println!("SKIPPED: item 17, C writer: no C compiler (cc)");
    }

    // The Rust writer (the demo's), in this process: root could remove the
    // file, but a file of another user is never removed.
    let dir = mkdir(&t.join("rust"), 0o1777);
    let name = format!("vramscope-{}-{}", current_uid(), std::process::id());
    for tag in [None, Some("demo")] {
        let planted = dir.join(match tag {
            Some(t) => format!("{name}-{t}"),
            None => name.clone(),
        });
        std::fs::write(&planted, b"not a segment").unwrap();
        chown(&planted, Some(OTHER), Some(OTHER)).unwrap();
        let mut cfg = SegmentConfig::new(&dir, Producer::Test, 1, 64);
        cfg.tag = tag.map(String::from);
        let w = SegmentWriter::create(&cfg).expect("a tagged name instead of an error");
        let got = w.path().file_name().unwrap().to_str().unwrap().to_string();
        let want = format!(
            "{}-{}r",
            name,
            tag.map(|t| format!("{t}_")).unwrap_or_default()
        );
        assert!(got.starts_with(&want), "{got}");
        assert!(w.notice().is_some_and(|n| n.contains("is taken")));
        assert!(SegmentReader::open(w.path()).is_ok());
        assert_eq!(std::fs::read(&planted).unwrap(), b"not a segment");
        drop(w);
        std::fs::remove_file(&planted).unwrap();
    }
    // A live segment is never replaced, not even one of this very process
    // (item 9 of the reliability issue): a tagged name beside it.
    let cfg = SegmentConfig::new(&dir, Producer::Test, 1, 64);
    let old = SegmentWriter::create(&cfg).unwrap();
    assert!(old.notice().is_none());
    let new = SegmentWriter::create(&cfg).unwrap();
    assert_ne!(new.path(), old.path());
    assert!(new.notice().is_some_and(|n| n.contains("is taken")));
    assert!(SegmentReader::open(old.path()).is_ok());
}
