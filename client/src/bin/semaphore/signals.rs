//! The signals that stop semaphore (SIGINT, SIGTERM, SIGHUP, SIGQUIT), as one
//! stream, each with whether the kernel sent it (a terminal's keys, a hangup)
//! or a process did (kill).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The `si_code` of the last delivery of each signal, by number.
static ORIGINS: [AtomicI32; 32] = [const { AtomicI32::new(0) }; 32];

const HANDLED: [Signal; 4] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// A signal semaphore got.
#[derive(Clone, Copy, Debug)]
pub struct Received {
    pub signal: Signal,
    /// The kernel sent it, to a whole process group: a terminal's Ctrl-C,
    /// Ctrl-\ or hangup. Not `kill` from a process.
    pub from_kernel: bool,
}

impl Received {
    /// semaphore's exit status for it.
    pub fn exit_code(self) -> u8 {
        128 + self.signal as u8
    }
}

pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    /// From now on these signals no longer end semaphore: they are read here.
    pub fn new() -> std::io::Result<Signals> {
        note_origins()?;
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    pub async fn recv(&mut self) -> Received {
        let signal = tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        };
        let code = ORIGINS[signal as usize].load(Ordering::SeqCst);
        Received {
            signal,
            from_kernel: sent_by_kernel(code),
        }
    }
}

/// Records each handled signal's `si_code` as it arrives. Registered before
/// tokio's own handlers (the registry runs them in that order, within the
/// same handler call), so the code is stored before tokio wakes `recv`.
fn note_origins() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        for signal in HANDLED {
            let number = signal as i32;
            // SAFETY: the action only stores an integer in a static atomic,
            // which is async-signal-safe.
            let registered = unsafe {
                signal_hook_registry::register_sigaction(number, move |info| {
                    ORIGINS[number as usize].store(info.si_code, Ordering::SeqCst);
                })
            };
            if let Err(err) = registered {
                result = Err(err);
                return;
            }
        }
    });
    result
}

#[cfg(target_os = "linux")]
fn sent_by_kernel(code: i32) -> bool {
    // A terminal's INTR, QUIT and hangup signals are sent by the kernel to
    // the foreground process group (kill_pgrp with SEND_SIG_PRIV).
    code == nix::libc::SI_KERNEL
}

#[cfg(not(target_os = "linux"))]
fn sent_by_kernel(_code: i32) -> bool {
    // Not known here: whether the command is in the terminal's foreground
    // process group then decides alone.
    true
}
