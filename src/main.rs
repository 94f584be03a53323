//! Entry point: the CNI plugin when `CNI_COMMAND` is set (and non-empty), otherwise
//! the subcommands (`daemon`, `operator`, `status`, ...).

fn main() {
    std::process::exit(podnet::run());
}
