//! The real binary in a pseudo-terminal: `vramscope demo` draws a first
//! frame, quits on `q` (and on SIGTERM) with status 0, and leaves the
//! terminal restored: the alternate screen left and the cursor shown again,
//! in that order, at the end of its output; `C` (capture stacks) is answered
//! by the demo through its control block and the step diff shows stacks.
//!
//! Until the CLI has a `demo` subcommand this prints a SKIP line and passes.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{Child, CommandBuilder, MasterPty, PtySize};

const LEAVE_ALT: &[u8] = b"\x1b[?1049l";
const SHOW_CURSOR: &[u8] = b"\x1b[?25h";

struct Session {
    child: Box<dyn Child + Send + Sync>,
    _master: Box<dyn MasterPty + Send>,
    writer: Box<dyn Write + Send>,
    output: Arc<Mutex<Vec<u8>>>,
    _shm: tempfile::TempDir,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

impl Session {
    fn start() -> Session {
        Session::start_in(None)
    }

    /// The demo, started in `cwd` (where `S` writes) when given.
    fn start_in(cwd: Option<&std::path::Path>) -> Session {
        Session::start_with(cwd, &[])
    }

    /// The demo, started in `cwd` when given, with `env` set.
    fn start_with(cwd: Option<&std::path::Path>, env: &[(&str, &std::path::Path)]) -> Session {
        let shm = tempfile::tempdir().unwrap();
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
        cmd.arg("demo");
        cmd.arg("--shm-dir");
        cmd.arg(shm.path());
        cmd.env_remove("NO_COLOR");
        if let Some(d) = cwd {
            cmd.cwd(d);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let common::Pty {
            child,
            master,
            keys,
            output,
        } = common::in_pty(cmd, 24, 80);
        Session {
            child,
            _master: master,
            writer: keys,
            output,
            _shm: shm,
        }
    }

    fn output(&self) -> Vec<u8> {
        self.output.lock().unwrap().clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output()).into_owned()
    }

    /// Waits until the output contains one of `needles`; returns which.
    fn wait_for(&mut self, needles: &[&str], timeout: Duration) -> Option<usize> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            let t = self.text();
            if let Some(i) = needles.iter().position(|n| t.contains(n)) {
                return Some(i);
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                // Exited: one last look at what it printed.
                std::thread::sleep(Duration::from_millis(100));
                let t = self.text();
                return needles.iter().position(|n| t.contains(n));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn wait_exit(&mut self, timeout: Duration) -> portable_pty::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the reader drain the last bytes.
                std::thread::sleep(Duration::from_millis(200));
                return s;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("vramscope did not exit; output:\n{:?}", self.text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `Some(true)` once a frame is up, `None` when the CLI has no `demo`.
    fn first_frame(&mut self) -> Option<()> {
        let seen = self.wait_for(
            &["unrecognized subcommand", "vramscope "],
            Duration::from_secs(20),
        );
        match seen {
            Some(0) => {
                let _ = self.wait_exit(Duration::from_secs(5));
                println!(
                    "SKIP ui_pty: this binary has no `demo` subcommand yet (the CLI is wired by the lead)"
                );
                None
            }
            Some(_) => Some(()),
            None => panic!("no first frame; output:\n{:?}", self.text()),
        }
    }
}

fn assert_restored(out: &[u8]) {
    let leave = rfind(out, LEAVE_ALT).expect("left the alternate screen");
    let show = rfind(out, SHOW_CURSOR).expect("showed the cursor");
    assert!(
        show > leave,
        "the cursor is shown after leaving the alternate screen"
    );
    // Nothing drawn after the restore but whitespace.
    let tail = &out[show + SHOW_CURSOR.len()..];
    assert!(
        tail.iter().all(|b| b.is_ascii_whitespace()),
        "output after the restore: {:?}",
        String::from_utf8_lossy(tail)
    );
    // It entered the alternate screen first, and bracketed frames.
    assert!(find(out, b"\x1b[?1049h").is_some());
    assert!(find(out, b"\x1b[?2026h").is_some(), "synchronized update");
}

#[test]
fn demo_quits_on_q_and_restores_the_terminal() {
    let mut s = Session::start();
    if s.first_frame().is_none() {
        return;
    }
    s.writer.write_all(b"q").unwrap();
    s.writer.flush().unwrap();
    assert_clean_exit(&mut s);
}

/// The demo exits with status 0 (else the end of its output, where a panic
/// message would be, is shown) and restores the terminal.
fn assert_clean_exit(s: &mut Session) {
    let status = s.wait_exit(Duration::from_secs(10));
    let out = s.output();
    let from = find(&out, b"panicked at").unwrap_or(out.len().saturating_sub(2000));
    assert!(
        status.success(),
        "exit status {status:?}; output from the panic (or its end): {:?}",
        String::from_utf8_lossy(&out[from..(from + 3000).min(out.len())])
    );
    assert_restored(&out);
}

#[test]
fn demo_restores_the_terminal_on_sigterm() {
    let mut s = Session::start();
    if s.first_frame().is_none() {
        return;
    }
    let pid = s.child.process_id().expect("a pid");
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    assert_clean_exit(&mut s);
}

/// Enlarging the terminal while the dashboard runs, then quitting, leaves
/// the shell's screen as it was: the output is played through a terminal
/// emulator (vt100) that is resized at the moment the pty is.
#[test]
fn enlarging_then_quitting_leaves_the_shell_screen_clean() {
    let mut s = Session::start();
    if s.first_frame().is_none() {
        return;
    }
    let mut term = vt100::Parser::new(nz(24), nz(80), 0);
    term.process(b"$ vramscope demo\r\n");
    let before = s.output().len();
    s._master
        .resize(PtySize {
            rows: 40,
            cols: 120,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    // A frame at the new size: its footer's right end is at column 120.
    std::thread::sleep(Duration::from_millis(800));
    s.writer.write_all(b"q").unwrap();
    s.writer.flush().unwrap();
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "exit status {status:?}");
    let out = s.output();
    term.process(&out[..before]);
    assert!(
        term.screen().alternate_screen(),
        "the dashboard drew on the alternate screen"
    );
    term.screen_mut().set_size(nz(40), nz(120));
    term.process(&out[before..]);
    let screen = term.screen();
    assert!(!screen.alternate_screen());
    assert!(!screen.hide_cursor());
    let text = screen.contents();
    assert!(text.starts_with("$ vramscope demo"), "{text:?}");
    assert_eq!(
        text.trim_end(),
        "$ vramscope demo",
        "the shell screen after quitting:\n{text}"
    );
}

fn nz(n: u16) -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(n).unwrap()
}

/// `C` in the demo's process view posts command 5 through the real
/// control block; the demo answers, the report says so, and the step diff
/// (`d`) then shows blocks with their code location.
#[test]
fn capture_stacks_key_in_the_demo_shows_code_locations() {
    let mut s = Session::start();
    if s.first_frame().is_none() {
        return;
    }
    // The demo's process view (opened once its segment is seen).
    assert!(
        s.wait_for(&["Timeline"], Duration::from_secs(10)).is_some(),
        "{:?}",
        s.text()
    );
    std::thread::sleep(Duration::from_millis(500));
    s.writer.write_all(b"C").unwrap();
    s.writer.flush().unwrap();
    assert_eq!(
        s.wait_for(&["capturing"], Duration::from_secs(10)),
        Some(0),
        "no answer to C: {:?}",
        s.text()
    );
    // A step or two under capture, then the step diff.
    std::thread::sleep(Duration::from_secs(3));
    // Esc closes the report (alone: Esc and a key at once read as Alt).
    s.writer.write_all(b"\x1b").unwrap();
    s.writer.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.writer.write_all(b"d").unwrap();
    s.writer.flush().unwrap();
    assert_eq!(
        s.wait_for(&["training_step"], Duration::from_secs(15)),
        Some(0),
        "no code location in the step diff: {:?}",
        s.text()
    );
    // q closes the overlay, q again quits.
    s.writer.write_all(b"q").unwrap();
    s.writer.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.writer.write_all(b"q").unwrap();
    s.writer.flush().unwrap();
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "exit status {status:?}");
    assert_restored(&s.output());
}

/// Issue 25 item 14: `S` wrote the screenshot by following a link another
/// user planted under the next free name in a shared directory (root made
/// a file where only root may write). The file is made new now
/// (`O_EXCL|O_NOFOLLOW`): a planted name is skipped, never followed.
#[test]
fn item14_s_never_follows_a_planted_link() {
    let shared = tempfile::tempdir().unwrap();
    let target = shared.path().join("victim");
    std::os::unix::fs::symlink(&target, shared.path().join("vramscope-001.svg")).unwrap();
    let mut s = Session::start_in(Some(shared.path()));
    if s.first_frame().is_none() {
        return;
    }
    s.writer.write_all(b"S").unwrap();
    s.writer.flush().unwrap();
    let written = shared.path().join("vramscope-002.svg");
    let start = Instant::now();
    while !written.exists() && !target.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    s.writer.write_all(b"q").unwrap();
    s.writer.flush().unwrap();
    assert_clean_exit(&mut s);
    assert!(!target.exists(), "the planted link was followed");
    let meta = std::fs::symlink_metadata(&written).unwrap();
    assert!(meta.file_type().is_file());
    assert!(std::fs::read_to_string(&written)
        .unwrap()
        .starts_with("<svg"));
}

/// Closing the terminal (a window closed, `tmux kill-session`, ssh
/// dropped: the pty hangs up) ends the demo as SIGTERM does: it exits, and
/// its segment leaves the segment directory (issue 46, item 7). Its last
/// writes to the terminal fail; none of them may panic it before it cleans
/// up.
#[test]
fn closing_the_terminal_removes_the_demos_segment() {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    let shm = tempfile::tempdir().unwrap();
    let pair = portable_pty::native_pty_system()
        .openpty(PtySize {
            rows: 40,
            cols: 120,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.args(["demo", "--shm-dir"]);
    cmd.arg(shm.path());
    cmd.env("TERM", "xterm-256color");
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    // The reader stops (closing its side) once told, at its next read:
    // the demo redraws often, so a read returns soon.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let mut r = pair.master.try_clone_reader().unwrap();
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while !stop.load(Ordering::SeqCst) {
                match r.read(&mut buf) {
                    Ok(n) if n > 0 => seen.lock().unwrap().extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
        })
    };
    let segments = || std::fs::read_dir(shm.path()).unwrap().count();
    let start = Instant::now();
    while segments() == 0 || !String::from_utf8_lossy(&seen.lock().unwrap()).contains("vramscope ")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no first frame and segment; output: {:?}",
            String::from_utf8_lossy(&seen.lock().unwrap())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Hang up: every descriptor of the pty's master side closed.
    stop.store(true, Ordering::SeqCst);
    drop(pair.master);
    reader.join().unwrap();
    let status = common::exit_within(child.as_mut(), Duration::from_secs(15));
    assert!(status.is_some(), "the demo did not exit on a hang-up");
    let left: Vec<_> = std::fs::read_dir(shm.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the demo's segment is left after the terminal closed: {left:?} (exit {status:?})"
    );
}

/// Issue 46, item 5: `--keep-exited SECS` sets how long an exited process
/// stays listed: a demo that ended a second into a 5 s dashboard is gone
/// from it with `--keep-exited 1`, and listed as exited by default (60 s).
#[test]
fn keep_exited_sets_how_long_an_exited_process_is_listed() {
    let shown_after_exit = |keep: Option<&str>| -> String {
        let mut s = Session::start();
        if s.first_frame().is_none() {
            return String::new();
        }
        let out = tempfile::tempdir().unwrap();
        let shot = out.path().join("x.svg");
        let mut cmd = common::vramscope();
        cmd.args(["--no-nvml", "--shm-dir"])
            .arg(s._shm.path())
            .args(["--size", "120x40", "--screenshot-after", "5000"])
            .arg("--screenshot")
            .arg(&shot);
        if let Some(k) = keep {
            cmd.args(["--keep-exited", k]);
        }
        let dashboard = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let pid = s.child.process_id().expect("a pid");
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        s.wait_exit(Duration::from_secs(10));
        let done = dashboard.wait_with_output().unwrap();
        assert!(done.status.success(), "{done:?}");
        common::svg_text(&shot)
    };
    let kept = shown_after_exit(None);
    if kept.is_empty() {
        return;
    }
    let row = kept.lines().find(|l| l.contains("demo: heal"));
    assert!(row.is_some_and(|r| r.contains("EXIT")), "{kept}");
    let dropped = shown_after_exit(Some("1"));
    assert!(!dropped.contains("demo: heal"), "{dropped}");
    // Bad values are one line naming the flag, exit 2.
    let bad = common::vramscope()
        .args(["--keep-exited", "-3"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--keep-exited"));
}

/// Issue 46, item 23: `S` writes where `VRAMSCOPE_SCREENSHOT_DIR` says,
/// else where the settings file's `screenshot_dir` says, else in the
/// current directory; a directory that is not there is said in one line.
#[test]
fn s_writes_where_the_environment_or_the_settings_file_say() {
    let cwd = tempfile::tempdir().unwrap();
    let by_env = tempfile::tempdir().unwrap();
    let by_file = tempfile::tempdir().unwrap();
    let settings = cwd.path().join("config.toml");
    std::fs::write(
        &settings,
        format!("[dashboard]\nscreenshot_dir = {:?}\n", by_file.path()),
    )
    .unwrap();
    let shot = |env: &[(&str, &std::path::Path)]| -> Option<String> {
        let mut s = Session::start_with(Some(cwd.path()), env);
        s.first_frame()?;
        // The demo's own view open first: its start says things in the
        // footer too ("waiting for pid ..."), over an earlier message.
        let start = Instant::now();
        while !common::screen(&s.output(), 24, 80)
            .screen()
            .contents()
            .contains("1 Timeline")
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the demo's view never opened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s.writer.write_all(b"S").unwrap();
        s.writer.flush().unwrap();
        // The footer, as a terminal shows it (frames redraw only what
        // changed).
        let start = Instant::now();
        let mut shown = String::new();
        while start.elapsed() < Duration::from_secs(10) {
            shown = common::screen(&s.output(), 24, 80).screen().contents();
            if shown.contains("screenshot vramscope-001.svg written")
                || shown.contains("screenshot failed")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        s.writer.write_all(b"q").unwrap();
        s.writer.flush().unwrap();
        assert_clean_exit(&mut s);
        Some(shown)
    };
    let written = |d: &std::path::Path| d.join("vramscope-001.svg").is_file();
    let Some(text) = shot(&[
        ("VRAMSCOPE_SCREENSHOT_DIR", by_env.path()),
        ("VRAMSCOPE_CONFIG", &settings),
    ]) else {
        return;
    };
    assert!(
        text.contains("screenshot vramscope-001.svg written in"),
        "{text}"
    );
    assert!(written(by_env.path()) && !written(by_file.path()) && !written(cwd.path()));
    shot(&[("VRAMSCOPE_CONFIG", &settings)]);
    assert!(written(by_file.path()) && !written(cwd.path()));
    // Not there: the footer says the screenshot failed, and nothing is
    // written.
    let gone = cwd.path().join("no-such-dir");
    let text = shot(&[("VRAMSCOPE_SCREENSHOT_DIR", &gone)]).unwrap();
    assert!(text.contains("screenshot failed"), "{text}");
    assert!(!gone.exists() && !written(cwd.path()));
}

/// Issue 46, item 1: `replay --ui` has playback controls, as a user sees
/// them on the caption: space pauses the playback (the input stays put)
/// and plays it again, `]` goes a step on and `[` a step back, End to the
/// end and Home to the start, `>` plays faster.
#[test]
fn replay_ui_pauses_seeks_by_step_and_changes_speed() {
    let rec = common::recording(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/diff"),
        "gpt2-b8",
    );
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.arg("replay");
    cmd.arg(rec.path());
    cmd.args(["--ui", "--speed", "2", "--no-mouse"]);
    let common::Pty {
        mut child,
        keys: mut keyboard,
        output,
        master: _master,
    } = common::in_pty(cmd, 40, 160);
    let screen = || {
        let out = output.lock().unwrap().clone();
        common::screen(&out, 40, 160).screen().contents()
    };
    // The caption's figure after `word` ("step 3 of" → 3).
    let after = |s: &str, word: &str| -> Option<u64> {
        let at = s.find(word)? + word.len();
        s[at..]
            .split(|c: char| !c.is_ascii_digit())
            .find(|w| !w.is_empty())?
            .parse()
            .ok()
    };
    let wait = |what: &dyn Fn(&str) -> bool| -> String {
        let start = Instant::now();
        loop {
            let s = screen();
            if what(&s) {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut press = |keys: &[u8]| {
        keyboard.write_all(keys).unwrap();
        keyboard.flush().unwrap();
    };
    let s = wait(&|s| after(s, "step ").is_some_and(|n| n >= 1));
    assert!(s.contains(" 2x "), "{s}");
    press(b" ");
    let s = wait(&|s| s.contains("PAUSED"));
    let input = after(&s, "input ").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(after(&screen(), "input "), Some(input), "paused");
    let step = after(&s, "step ").unwrap();
    press(b"]");
    let s = wait(&|s| after(s, "step ") == Some(step + 1));
    assert!(s.contains("PAUSED"), "a seek keeps it paused: {s}");
    press(b"]");
    wait(&|s| after(s, "step ") == Some(step + 2));
    press(b"[");
    wait(&|s| after(s, "step ") == Some(step + 1));
    press(b"\x1b[F"); // End
    wait(&|s| s.contains("END of the recording"));
    press(b"\x1b[H"); // Home
    wait(&|s| after(s, "step ") == Some(0) && after(s, "input ") == Some(0));
    press(b">");
    wait(&|s| s.contains(" 4x "));
    press(b" ");
    wait(&|s| !s.contains("PAUSED") && after(s, "input ").is_some_and(|n| n > 0));
    press(b"q");
    let status = common::exit_within(child.as_mut(), Duration::from_secs(10));
    assert!(status.as_ref().is_some_and(|s| s.success()), "{status:?}");
}
