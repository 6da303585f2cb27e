//! NVIDIA's Multi-Process Service: whether its control daemon runs, and starting and stopping
//! it for one benchmark ([`Daemon`]). The daemon listens on the socket `control` in its pipe
//! directory (`CUDA_MPS_PIPE_DIRECTORY`, `/tmp/nvidia-mps` by default); CUDA clients, the
//! ranks, find it there through the same variable, which they inherit.

use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The control program of MPS.
pub const CONTROL: &str = "nvidia-cuda-mps-control";

/// How long a started daemon may take to open its control socket.
const START_WAIT: Duration = Duration::from_secs(5);

/// The pipe directory, as the daemon and the CUDA clients of this environment use it.
pub fn pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"))
}

/// Whether the control daemon runs: its socket exists in the pipe directory.
pub fn running() -> bool {
    std::fs::metadata(pipe_dir().join("control")).is_ok_and(|m| m.file_type().is_socket())
}

/// A control daemon this process started; [`Daemon::stop`] (or dropping it) stops it.
#[derive(Debug)]
pub struct Daemon {
    stopped: bool,
}

impl Daemon {
    /// Starts the daemon (`nvidia-cuda-mps-control -d`) and waits until its control socket is
    /// there.
    pub fn start() -> Result<Daemon, String> {
        let out = Command::new(CONTROL)
            .arg("-d")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {CONTROL} -d: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{CONTROL} -d exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let t = Instant::now();
        while !running() {
            if t.elapsed() > START_WAIT {
                // It may still come up: ask it to quit rather than leave it behind.
                let _ = quit();
                return Err(format!(
                    "{CONTROL} -d started but no control socket appeared in {} within {} s \
                     (see its log, CUDA_MPS_LOG_DIRECTORY, /var/log/nvidia-mps by default)",
                    pipe_dir().display(),
                    START_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Daemon { stopped: false })
    }

    /// Stops the daemon (`echo quit | nvidia-cuda-mps-control`).
    pub fn stop(mut self) -> Result<(), String> {
        self.stopped = true;
        quit()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.stopped {
            if let Err(e) = quit() {
                eprintln!("rustccl-bench: stopping MPS: {e}");
            }
        }
    }
}

/// Sends `quit` to the control daemon.
fn quit() -> Result<(), String> {
    let mut child = Command::new(CONTROL)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {CONTROL}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(b"quit\n")
            .map_err(|e| format!("writing to {CONTROL}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {CONTROL}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`echo quit | {CONTROL}` exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}
