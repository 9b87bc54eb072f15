//! What the workspace's middleware services share, as tower-http shares it.

/// `get_ref`, `get_mut` and `into_inner` for a middleware service whose inner service `S` is
/// its field `inner`: the accessors tower's own middleware has. Written once, as tower-http's
/// `define_inner_service_accessors!`, for the layers of this workspace; put it in the
/// service's own `impl<S, ..> MyService<S, ..>` block (not its `Service` impl).
///
/// ```
/// pub struct Logged<S> {
///     inner: S,
/// }
///
/// impl<S> Logged<S> {
///     tower_agent_core::inner_service_accessors!();
/// }
///
/// let mut logged = Logged { inner: 1 };
/// *logged.get_mut() += 1;
/// assert_eq!((*logged.get_ref(), logged.into_inner()), (2, 2));
/// ```
#[macro_export]
#[doc(hidden)]
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwrap the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
