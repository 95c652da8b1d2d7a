//! Filters: a pod is a candidate when it plays the requested role, is not down (its poll failed
//! outright, or it was ejected for failing requests: see `crate::health`; a pod whose polls are
//! merely late stays a candidate), and serves the model (when it reports its models at all, and
//! the request names one: SGLang's `/generate` names none, and any pod serves it).

use super::{PodView, RouteRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No pod of this role is configured or discovered.
    NoPods,
    /// Pods exist but all are down.
    NoneHealthy,
    /// Pods exist but none has been heard from yet (start-up).
    NoneKnownYet,
    /// Healthy pods exist but none reports serving the requested model.
    UnknownModel,
    /// Every candidate is saturated and the request's priority is negative (shed).
    Saturated,
    /// No pod is predicted to meet the request's latency objectives and its priority is negative.
    SloUnattainable,
    /// With flow control on: every candidate is full (`crate::admission`); the request is held.
    Full,
}

impl Rejection {
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::NoPods => "no pods are known for this pool",
            Rejection::NoneKnownYet => "no pod has answered its first metrics poll yet",
            Rejection::NoneHealthy => {
                "no pod is healthy (all refuse their metrics polls or fail their requests)"
            }
            Rejection::UnknownModel => "no healthy pod serves the requested model",
            Rejection::Saturated => {
                "every pod that serves this model is saturated; requests of negative priority are shed, retry later"
            }
            Rejection::Full => "every pod that serves this model is full",
            Rejection::SloUnattainable => {
                "no pod is predicted to meet the request's latency objectives; requests of negative priority are shed, retry later"
            }
        }
    }
}

pub fn filter<'p, 'a>(
    pods: &'p [PodView<'a>],
    request: &RouteRequest<'_>,
) -> Result<Vec<&'p PodView<'a>>, Rejection> {
    let of_role: Vec<&PodView> = pods
        .iter()
        .filter(|p| request.roles.contains(&p.role))
        .collect();
    if of_role.is_empty() {
        return Err(Rejection::NoPods);
    }
    use crate::health::Health;
    if of_role.iter().all(|p| p.health == Health::Unknown) {
        return Err(Rejection::NoneKnownYet);
    }
    let healthy: Vec<&PodView> = of_role
        .into_iter()
        .filter(|p| matches!(p.health, Health::Fresh | Health::Stale))
        .collect();
    if healthy.is_empty() {
        return Err(Rejection::NoneHealthy);
    }
    let serving: Vec<&PodView> = healthy
        .into_iter()
        .filter(|p| {
            request.model.is_empty()
                || p.models.is_empty()
                || p.models.iter().any(|m| m == request.model)
        })
        .collect();
    if serving.is_empty() {
        return Err(Rejection::UnknownModel);
    }
    Ok(serving)
}
