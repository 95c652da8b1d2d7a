//! Filters: a pod is a candidate when it plays the requested role, is not down (its poll failed
//! outright, or it was ejected for failing requests: see `crate::health`; a pod whose polls are
//! merely late stays a candidate), and serves the model (when it reports its models at all).

use super::{PodView, RouteRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No pod of this role is configured or discovered.
    NoPods,
    /// Pods exist but all are down.
    NoneHealthy,
    /// Healthy pods exist but none reports serving the requested model.
    UnknownModel,
    /// Every candidate is saturated and the request's priority is negative (shed).
    Saturated,
    /// No pod is predicted to meet the request's latency objectives and its priority is negative.
    SloUnattainable,
}

impl Rejection {
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::NoPods => "no pods are known for this pool",
            Rejection::NoneHealthy => {
                "no pod is healthy (all refuse their metrics polls or fail their requests)"
            }
            Rejection::UnknownModel => "no healthy pod serves the requested model",
            Rejection::Saturated => {
                "every pod that serves this model is saturated; requests of negative priority are shed, retry later"
            }
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
    let healthy: Vec<&PodView> = of_role
        .into_iter()
        .filter(|p| p.health != crate::health::Health::Down)
        .collect();
    if healthy.is_empty() {
        return Err(Rejection::NoneHealthy);
    }
    let serving: Vec<&PodView> = healthy
        .into_iter()
        .filter(|p| p.models.is_empty() || p.models.iter().any(|m| m == request.model))
        .collect();
    if serving.is_empty() {
        return Err(Rejection::UnknownModel);
    }
    Ok(serving)
}
