//! Child processes of a test bed: each in its own process group, its stdout and
//! stderr in a log file, killed and reaped on drop so that no process outlives
//! the bed, even when a test panics.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::{Context as _, Result, bail};
use rustix::process::{Pid, Signal, kill_process, kill_process_group};

/// How much of a log [`Process::tail`] shows by default.
pub const TAIL_BYTES: u64 = 6 * 1024;

/// A running child process of the test bed.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args` in a new process group, appending its
    /// stdout and stderr to `log`.
    pub fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        envs: &[(&str, &str)],
        log: PathBuf,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("duplicating {}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            log,
        })
    }

    /// The name given at spawn time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The file holding the process's stdout and stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails, with the end of the log, when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        let status = match self.child.as_mut() {
            None => bail!("{} was stopped", self.name),
            Some(child) => child
                .try_wait()
                .with_context(|| format!("checking on {}", self.name))?,
        };
        if let Some(status) = status {
            self.child = None;
            bail!(
                "{} exited ({status}); its log ends:\n{}",
                self.name,
                self.tail(TAIL_BYTES)
            );
        }
        Ok(())
    }

    /// The last `bytes` bytes of the log (from a line start), or a note why it cannot be read.
    pub fn tail(&self, bytes: u64) -> String {
        tail_of(&self.log, bytes)
            .unwrap_or_else(|err| format!("<cannot read {}: {err}>", self.log.display()))
    }

    /// Sends SIGTERM to the process (not its group), as the kubelet stops a container.
    pub fn terminate(&self) -> Result<()> {
        let child = self
            .child
            .as_ref()
            .with_context(|| format!("{} is not running", self.name))?;
        let pid = Pid::from_child(child);
        kill_process(pid, Signal::TERM).with_context(|| format!("SIGTERM to {}", self.name))
    }

    /// The exit status once the process has exited (reaping it), `None` while it runs.
    pub fn try_exit(&mut self) -> Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was stopped", self.name)
        };
        let status = child
            .try_wait()
            .with_context(|| format!("checking on {}", self.name))?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// Kills the whole process group and reaps the process. Idempotent.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // The group may already be gone (the process exited); then there is nothing to kill.
        let _ = kill_process_group(Pid::from_child(&child), Signal::KILL);
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail_of(path: &Path, bytes: u64) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(match text.find('\n') {
        Some(newline) if start > 0 => text[newline + 1..].to_owned(),
        _ => text.into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_kills_and_reaps_the_process_group() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("sleep.log");
        let mut process = Process::spawn(
            "sh",
            Path::new("/bin/sh"),
            ["-c", "echo started; sleep 600 & sleep 600"],
            &[],
            log,
        )?;
        process.ensure_running()?;
        let status = process.stop().context("a status")?;
        assert!(!status.success());
        assert!(process.ensure_running().is_err());
        Ok(())
    }

    #[test]
    fn reports_an_exited_process_with_its_log() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut process = Process::spawn(
            "failing",
            Path::new("/bin/sh"),
            ["-c", "echo boom >&2; exit 3"],
            &[],
            dir.path().join("failing.log"),
        )?;
        // std caches the status, so `ensure_running` sees the exit afterwards.
        let status = process.child.as_mut().context("child")?.wait()?;
        assert_eq!(status.code(), Some(3));
        let err = process.ensure_running().err().context("an error")?;
        let message = format!("{err:#}");
        assert!(message.contains("failing exited"), "{message}");
        assert!(message.ends_with("boom\n"), "{message}");
        assert!(process.stop().is_none());
        Ok(())
    }

    #[test]
    fn tail_starts_at_a_line() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("log");
        std::fs::write(&path, "first line\nsecond line\nthird\n")?;
        assert_eq!(tail_of(&path, 10)?, "third\n");
        assert_eq!(tail_of(&path, 1000)?, "first line\nsecond line\nthird\n");
        Ok(())
    }
}
