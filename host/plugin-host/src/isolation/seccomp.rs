//! The seccomp filter of isolated children with `isolation.seccomp: true`: plugin code
//! may not start programs or processes, nor trace or write into other processes. The
//! kernel kills a child that tries (SIGSYS); the supervisor counts and restarts it like
//! any other death. Threads stay allowed (the child needs them, and so may plugins).

use std::collections::BTreeMap;

use seccompiler::{
    apply_filter_all_threads, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp,
    SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// Why the filter could not be installed (seccompiler's own errors).
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The filter cannot be built (or this architecture has none).
    #[error(transparent)]
    Build(#[from] seccompiler::BackendError),
    #[error(transparent)]
    Install(#[from] seccompiler::Error),
}

/// Installs the filter on every thread of this process.
pub fn install() -> Result<(), SeccompError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_process_vm_writev,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_fork,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_vfork,
    ]
    .into_iter()
    .map(|call| (call, Vec::new()))
    .collect();
    // `clone` without CLONE_THREAD is a new process (glibc's fork and posix_spawn).
    let new_process = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        0,
    )
    .and_then(|c| SeccompRule::new(vec![c]))?;
    denied.insert(libc::SYS_clone, vec![new_process]);
    let kill = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::KillProcess,
        arch,
    )?;
    // clone3 passes its flags in memory, where a filter cannot look: refuse it with ENOSYS,
    // and the C library falls back to `clone` (filtered above).
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    for filter in [kill, clone3] {
        let program = BpfProgram::try_from(filter)?;
        apply_filter_all_threads(&program)?;
    }
    Ok(())
}
