//! The tenant's request context, carried by the task across `.await`.
//!
//! A thread-local context ([`kv_stage::ContextScope`]) does not survive an
//! `.await`: the task may resume on another worker thread, and other tasks
//! run on this one meanwhile. Here the context is a tokio *task-local*: set
//! for a future with [`scope`], read with [`current`]. The RocksDB call's
//! own file I/O (its WAL append, the reads of a get) is counted for the
//! tenant but enforced as foreground (see [`AsyncDb`](crate::AsyncDb)).

use std::future::Future;

use kv_stage::RequestContext;
use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static CONTEXT: RequestContext;
}

/// Runs `f` with `context` as its request context, across every `.await`
/// in it, whichever worker thread it resumes on. Spawn the result to give
/// a whole task a tenant:
///
/// ```
/// # let rt = tokio::runtime::Runtime::new().unwrap();
/// # rt.block_on(async {
/// use kv_stage::RequestContext;
/// let tenant = RequestContext::register("tenant_a").unwrap();
/// let seen = tokio::spawn(kv_async::scope(tenant, async {
///     tokio::task::yield_now().await;
///     kv_async::current()
/// }))
/// .await
/// .unwrap();
/// assert_eq!(seen, tenant);
/// # });
/// ```
///
/// A task spawned *inside* the scope (`tokio::spawn`, `JoinSet::spawn`)
/// starts without it: a task-local belongs to its task, so the new task
/// runs as `foreground` and a tenant's limit does not reach it. Carry the
/// context over by scoping the spawned future too:
///
/// ```
/// # let rt = tokio::runtime::Runtime::new().unwrap();
/// # rt.block_on(async {
/// # let tenant = kv_stage::RequestContext::register("tenant_b").unwrap();
/// kv_async::scope(tenant, async {
///     let inner = tokio::spawn(kv_async::scope(kv_async::current(), async { kv_async::current() }));
///     assert_eq!(inner.await.unwrap(), tenant);
///     // Without the inner scope the spawned task is foreground's.
///     let lost = tokio::spawn(async { kv_async::current() });
///     assert_eq!(lost.await.unwrap(), kv_stage::RequestContext::FOREGROUND);
/// })
/// .await;
/// # });
/// ```
pub fn scope<F: Future>(context: RequestContext, f: F) -> TaskLocalFuture<RequestContext, F> {
    CONTEXT.scope(context, f)
}

/// The request context of the calling task: the one [`scope`] set, or else
/// the calling thread's ([`RequestContext::current`], foreground unless a
/// [`ContextScope`](kv_stage::ContextScope) set another).
#[inline]
pub fn current() -> RequestContext {
    CONTEXT.try_with(|c| *c).unwrap_or_else(|_| RequestContext::current())
}
