//! `ringtrain agent`: the node agent ([`ringtrain_agent`]), started from the command line.

use std::process::ExitCode;

pub use ringtrain_agent::Args;

pub fn run(args: Args) -> ExitCode {
    super::block_on("agent", ringtrain_agent::serve_node(args))
}
