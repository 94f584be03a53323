use super::*;

/// The nice value of thread `tid` of this process, from /proc.
fn nice_of(tid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
    // The fields after the command (which may hold spaces) end with ')'.
    let after = stat.rsplit_once(") ").expect("stat fields").1;
    let fields: Vec<&str> = after.split(' ').collect();
    // Field 19 of stat is nice; `after` starts at field 3.
    fields[19 - 3].parse().expect("nice")
}

#[tokio::test]
async fn jobs_run_in_order_on_a_nicer_thread_and_the_caller_keeps_its_priority() {
    let worker = Worker::start().expect("the thread");
    let caller = nix::unistd::gettid().as_raw();
    let before = nice_of(caller);
    let (tid, nice) = worker
        .run(|| {
            let tid = nix::unistd::gettid().as_raw();
            (tid, nice_of(tid))
        })
        .await
        .expect("ran");
    assert_ne!(tid, caller, "its own thread");
    assert_eq!(nice, (before + NICE).min(19), "nicer by NICE");
    assert_eq!(
        nice_of(caller),
        before,
        "the caller's priority is unchanged"
    );
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let runs = (0..5).map(|i| {
        let order = order.clone();
        worker.run(move || order.lock().expect("lock").push(i))
    });
    for r in futures::future::join_all(runs).await {
        r.expect("ran");
    }
    assert_eq!(*order.lock().expect("lock"), [0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_panic_in_a_job_continues_in_the_caller_and_the_thread_goes_on() {
    let worker = std::sync::Arc::new(Worker::start().expect("the thread"));
    let shared = worker.clone();
    let caller = tokio::spawn(async move { shared.run(|| panic!("in the job")).await }).await;
    assert!(
        caller.is_err_and(|e| e.is_panic()),
        "the job's panic reaches the caller"
    );
    assert_eq!(worker.run(|| 7).await.expect("ran"), 7, "the same thread");
}
