//! The terminal, set up and restored in exactly one place. `restore` runs
//! at most once per `enter`, from whichever exit path comes first: the
//! guard's drop (normal quit, Ctrl-C as a key, SIGINT/SIGTERM/SIGHUP through
//! the driver and the loop, an error) or the panic hook. It leaves the alternate screen and
//! shows the cursor last, so a shell prompt after us is always usable.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use crossterm::cursor::{Hide, Show};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen,
};

static ACTIVE: AtomicBool = AtomicBool::new(false);
static MOUSE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Restores the terminal when dropped.
pub(crate) struct Guard(());

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

/// Raw mode, alternate screen, hidden cursor, optionally mouse reporting.
pub(crate) fn enter(mouse: bool) -> io::Result<Guard> {
    install_panic_hook();
    enable_raw_mode()?;
    ACTIVE.store(true, Ordering::SeqCst);
    MOUSE.store(mouse, Ordering::SeqCst);
    let guard = Guard(());
    let mut out = io::stdout();
    execute!(out, EnterAlternateScreen, Hide, Clear(ClearType::All))?;
    if mouse {
        execute!(out, EnableMouseCapture)?;
    }
    Ok(guard)
}

/// Puts the terminal back as it was (idempotent).
pub(crate) fn restore() {
    if !ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    let mut out = io::stdout();
    if MOUSE.load(Ordering::SeqCst) {
        let _ = execute!(out, DisableMouseCapture);
    }
    // The dashboard's screen is wiped before it is left: a terminal that
    // does not restore the main screen exactly (resized while alternate,
    // or no alternate screen at all) shows an empty screen rather than
    // the dashboard's last lines.
    let _ = execute!(out, Clear(ClearType::All), LeaveAlternateScreen, Show);
    let _ = out.flush();
    let _ = disable_raw_mode();
}

/// Restores the terminal before the default hook prints the panic, then,
/// if the terminal was ours, ends the program.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = ACTIVE.load(Ordering::SeqCst);
            restore();
            previous(info);
            if ours {
                std::process::exit(101);
            }
        }));
    });
}
