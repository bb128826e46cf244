//! Signals a rank leaves to its agent.

/// SIGUSR1 is the agent's: Slurm's grace signal before a time limit (`--signal=USR1@N`) goes to every
/// process of a job step, ranks included, and the agent answers it by having its ranks checkpoint and stop
/// (their stop file). A rank started by an agent ignores it rather than die of it (the default action)
/// without a checkpoint. Called before the sandbox and before any thread starts.
#[allow(unsafe_code)] // the one libc call here
pub fn leave_grace_signal_to_agent() {
    // SAFETY: setting a signal's disposition to "ignore" touches no memory of this process, and no other
    // thread is running yet
    unsafe {
        libc::signal(libc::SIGUSR1, libc::SIG_IGN);
    }
}
