//! The policy loop's own thread: the compile and the table writes (and the nft
//! processes they start, which inherit its priority) run there, at nice
//! [`NICE`], so that while policies churn the CPU goes to the plugin's requests
//! first. A thread of its own, not the runtime's blocking pool: the agent has no
//! CAP_SYS_NICE, so a pool thread made nicer could never be made less nice again
//! for the journal work the pool also does. Lowering one's own priority needs no
//! capability; when the kernel refuses all the same, the thread runs at the
//! agent's priority and says so once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

/// The nice value of the policy thread (0 is the agent's; 19 the lowest).
pub const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The thread's end of the work: jobs in, run one at a time in order.
pub struct Worker {
    jobs: mpsc::Sender<Job>,
}

/// The thread is gone (it could not start, or the process is ending).
#[derive(Debug, thiserror::Error)]
#[error("the policy thread is not running")]
pub struct WorkerGone;

impl Worker {
    /// Starts the thread; it lowers its own priority to [`NICE`] first.
    pub fn start() -> std::io::Result<Worker> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("policy".into())
            .spawn(move || {
                if let Err(e) = lower_own_priority(NICE) {
                    tracing::warn!(error = %e, nice = NICE, "NetworkPolicy: the policy thread keeps the agent's priority");
                }
                for job in queue {
                    job();
                }
            })?;
        Ok(Worker { jobs })
    }

    /// Runs `work` on the thread and waits for its answer; a panic in `work`
    /// continues here, as it would have on the caller's thread.
    pub async fn run<T, F>(&self, work: F) -> Result<T, WorkerGone>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = answer.send(catch_unwind(AssertUnwindSafe(work)));
        });
        self.jobs.send(job).map_err(|_| WorkerGone)?;
        match answered.await.map_err(|_| WorkerGone)? {
            Ok(done) => Ok(done),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Sets the calling thread's nice value to `nice` (on Linux a thread's own).
fn lower_own_priority(nice: i32) -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    let who =
        libc::id_t::try_from(tid).map_err(|_| std::io::Error::other("a negative thread ID"))?;
    // SAFETY: setpriority reads its three integer arguments only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
#[path = "tests/worker.rs"]
mod tests;
