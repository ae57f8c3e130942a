//! muxflow's SPANK plugin.
//!
//! One dispatcher (this file) and one module per Slurm process context, as in
//! NVIDIA's pyxis:
//! - `submit`: allocator (sbatch/salloc) and local (srun) contexts, run as
//!   the user: validate `--muxflow` and the admin's settings, export the mode.
//! - `remote`: slurmstepd, per step: the job environment. Never fails in
//!   `init_post_opt` (a failure there drains the node, on every release).
//!   `init` fails only from Slurm 25.05 on, where the plugin declares that
//!   this fails the job instead (`compat`): an offline job on a node whose
//!   muxflow config cannot be read.
//!
//! Other contexts (slurmd, job_script) have nothing to do yet and do nothing.

use std::error::Error;

use slurm_spank::{Context, Plugin, SpankHandle, SpankOption};

mod compat;
mod preload;
mod remote;
mod settings;
mod submit;

/// Name of the option (`--muxflow`) and of the plugin in SPANK_PLUGIN!.
pub(crate) const OPTION: &str = "muxflow";
/// `--muxflow`'s help text (sbatch --help; the man page carries it too).
pub(crate) const OPTION_USAGE: &str = "Share GPUs with muxflow: 'online' (latency-critical, owns the GPU) or 'offline' (best-effort, runs in the idle capacity)";

include!(concat!(env!("OUT_DIR"), "/plugin_decl.rs"));

#[derive(Default)]
pub struct MuxflowPlugin {
    remote: remote::RemoteState,
}

// SAFETY: the plugin keeps no thread-affine state; slurm-spank calls it
// sequentially from one thread per process.
unsafe impl Plugin for MuxflowPlugin {
    fn init(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        // Registering can only fail on a duplicate name; in remote context a
        // failure must not reach Slurm, so it is logged there instead.
        let registered = spank.register_option(
            SpankOption::new(OPTION)
                .takes_value("mode")
                .usage(OPTION_USAGE),
        );
        match (spank.context()?, registered) {
            (Context::Remote, Ok(())) if compat::REMOTE_FAILS_JOB => {
                remote::check_node_config(spank).map_err(Into::into)
            }
            (_, Ok(())) => Ok(()),
            (Context::Allocator | Context::Local, Err(e)) => Err(Box::new(e)),
            (_, Err(e)) => {
                tracing::error!("muxflow: cannot register --{OPTION}: {e}");
                Ok(())
            }
        }
    }

    fn init_post_opt(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        match spank.context()? {
            Context::Allocator | Context::Local => submit::init_post_opt(spank).map_err(Into::into),
            Context::Remote => {
                self.remote.init_post_opt(spank);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn task_init(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        match spank.context()? {
            Context::Remote => self.remote.task_init(spank).map_err(Into::into),
            _ => Ok(()),
        }
    }

    fn exit(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        if spank.context()? == Context::Remote {
            self.remote.exit();
        }
        Ok(())
    }

    fn report_error(&self, error: &dyn Error) {
        // muxflow's error messages already carry their causes.
        // slurm_error: sbatch/srun print it to the user as "error: …".
        slurm_spank::spank_log(slurm_spank::LogLevel::Error, &error.to_string());
    }
}

/// The plugin's man page (`etc/man/spank-muxflow.8`, written by hand) kept
/// in step with what the plugin accepts.
#[cfg(test)]
mod man_page {
    /// The plugin's man page, as text: fonts and roff escapes removed,
    /// whitespace collapsed.
    fn man_page_text() -> String {
        let page = include_str!("../../etc/man/spank-muxflow.8");
        let text: String = page
            .lines()
            .filter(|l| !l.starts_with(".\\\"") && !l.starts_with(".TH"))
            .map(|l| {
                let l = l.strip_prefix(".B ").or(l.strip_prefix(".I ")).unwrap_or(l);
                if l.starts_with('.') {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let text = ["\\fB", "\\fI", "\\fR", "\\fP", "\\&"]
            .iter()
            .fold(text, |t, f| t.replace(f, ""))
            .replace("\\-", "-")
            .replace("\\(aq", "'");
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_man_page_names_every_key_and_the_options_help() {
        let page = man_page_text();
        for (key, what) in muxflow::config::plugstack::ARGS {
            assert!(
                page.contains(&format!("{key}=")),
                "etc/man/spank-muxflow.8 does not document the plugstack key '{key}': add it"
            );
            assert!(
                page.contains(what),
                "etc/man/spank-muxflow.8 does not say what '{key}' does as src/config/plugstack.rs does: '{what}'"
            );
        }
        assert!(
            page.contains(&format!("--{}=", crate::OPTION)),
            "the man page does not name --{}",
            crate::OPTION
        );
        assert!(
            page.contains(crate::OPTION_USAGE),
            "etc/man/spank-muxflow.8 does not carry the option's help text '{}'",
            crate::OPTION_USAGE
        );
    }
}
