//! The route table: each route's method, path and log key, in one list; the
//! match of a request against it (404, 405 with `Allow`) and the id in a raw
//! path.

use crate::error::Error;

/// The routes of API.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    Register,
    Inspect,
    Delete,
    Borrow,
    Return,
    /// Async mode: a ticket, its grant delivered to a callback.
    Enqueue,
    Ticket,
    Cancel,
}

/// Where a route lives: on the pool, `/l/{id}`, or on one of its actions,
/// `/l/{id}/<action>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Pool,
    Action(&'static str),
}

/// Every route with its method, path and route key (as API Gateway names it;
/// safe to log). The one table routing, `Allow` and the Lambda adapter read.
const ROUTES: [(Route, &str, Path, &str); 8] = [
    (Route::Register, "PUT", Path::Pool, "PUT /l/{id}"),
    (Route::Inspect, "GET", Path::Pool, "GET /l/{id}"),
    (Route::Delete, "DELETE", Path::Pool, "DELETE /l/{id}"),
    (
        Route::Borrow,
        "POST",
        Path::Action("borrow"),
        "POST /l/{id}/borrow",
    ),
    (
        Route::Return,
        "POST",
        Path::Action("return"),
        "POST /l/{id}/return",
    ),
    (
        Route::Enqueue,
        "POST",
        Path::Action("enqueue"),
        "POST /l/{id}/enqueue",
    ),
    (
        Route::Ticket,
        "POST",
        Path::Action("ticket"),
        "POST /l/{id}/ticket",
    ),
    (
        Route::Cancel,
        "POST",
        Path::Action("cancel"),
        "POST /l/{id}/cancel",
    ),
];

impl Route {
    fn entry(self) -> &'static (Route, &'static str, Path, &'static str) {
        // Every variant is in the table (a unit test checks it).
        ROUTES
            .iter()
            .find(|(route, ..)| *route == self)
            .unwrap_or(&ROUTES[0])
    }

    pub fn method(self) -> &'static str {
        self.entry().1
    }

    pub fn key(self) -> &'static str {
        self.entry().3
    }

    /// The path as API Gateway's route names it (`/l/{id}/borrow`).
    pub fn template_path(self) -> &'static str {
        let key = self.key();
        key.split_once(' ').map_or(key, |(_, path)| path)
    }

    fn path(self) -> Path {
        self.entry().2
    }
}

/// The methods of the routes on `path`, as an `Allow` header lists them.
fn allow(path: Path) -> String {
    let methods: Vec<&str> = ROUTES
        .iter()
        .filter(|(_, _, p, _)| *p == path)
        .map(|(_, method, ..)| *method)
        .collect();
    methods.join(", ")
}

/// Splits a path into its `l`, id and optional action segments, ignoring a
/// trailing slash and a query. `anchored`: the path starts with `/l/`;
/// otherwise anything may come before the last `/l/` (a stage prefix).
fn segments(path: &str, anchored: bool) -> Option<(&str, Option<&str>)> {
    let path = path.split('?').next().unwrap_or_default();
    let path = path.strip_suffix('/').unwrap_or(path);
    let parts: Vec<&str> = path.split('/').collect();
    let l = if anchored {
        (parts.first() == Some(&"") && parts.get(1) == Some(&"l")).then_some(1)?
    } else {
        parts
            .iter()
            .rposition(|p| *p == "l")
            .filter(|&i| i + 3 >= parts.len())?
    };
    match &parts[l + 1..] {
        [id] if !id.is_empty() => Some((id, None)),
        [id, action] if !id.is_empty() => Some((id, Some(action))),
        _ => None,
    }
}

/// Which path of the table `action` names.
fn path_of(action: Option<&str>) -> Option<Path> {
    match action {
        None => Some(Path::Pool),
        Some(action) => ROUTES.iter().find_map(|(_, _, path, _)| match path {
            Path::Action(a) if *a == action => Some(*path),
            _ => None,
        }),
    }
}

/// Matches a request against the table: the route for `method` on `path` and
/// the raw id segment, or 404 (no such path) / 405 (with the right methods).
pub fn resolve<'p>(method: &str, path: &'p str) -> Result<(Route, &'p str), Error> {
    let (id, action) = segments(path, true).ok_or(Error::RouteNotFound)?;
    let path = path_of(action).ok_or(Error::RouteNotFound)?;
    ROUTES
        .iter()
        .find(|(_, m, p, _)| *p == path && *m == method)
        .map(|(route, ..)| (*route, id))
        .ok_or_else(|| Error::MethodNotAllowed { allow: allow(path) })
}

/// Finds the id in a raw path for `route`, when no path parameter was given
/// (Function URL, `cargo lambda watch`, a stage prefix): the segment after the
/// last `/l/`, with the route's action after it.
pub fn id_from_path(route: Route, path: &str) -> Option<&str> {
    let (id, action) = segments(path, false)?;
    (path_of(action) == Some(route.path())).then_some(id)
}

/// Every route (for tests): a new `Route` variant fails to compile here,
/// so the tests over it (its row in `ROUTES`, its operation in openapi.yaml)
/// cannot miss it.
#[cfg(test)]
pub(crate) fn every_route() -> [Route; 8] {
    let every = |route: Route| match route {
        Route::Register
        | Route::Inspect
        | Route::Delete
        | Route::Borrow
        | Route::Return
        | Route::Enqueue
        | Route::Ticket
        | Route::Cancel => route,
    };
    [
        Route::Register,
        Route::Inspect,
        Route::Delete,
        Route::Borrow,
        Route::Return,
        Route::Enqueue,
        Route::Ticket,
        Route::Cancel,
    ]
    .map(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_in_the_table() {
        for route in every_route() {
            let rows = ROUTES.iter().filter(|(r, ..)| *r == route).count();
            assert_eq!(rows, 1, "{route:?}");
        }
        assert_eq!(ROUTES.len(), every_route().len());
        for (route, ..) in ROUTES {
            let path = match route.path() {
                Path::Pool => "/l/x".to_string(),
                Path::Action(action) => format!("/l/x/{action}"),
            };
            assert_eq!(resolve(route.method(), &path), Ok((route, "x")));
            assert_eq!(id_from_path(route, &path), Some("x"));
        }
    }

    #[test]
    fn routes_resolve_like_api_gateway() {
        let id = "9f1c2e7a-5b3d-4c8e-a1f0-6d2b9c4e7a01";
        assert_eq!(
            resolve("PUT", &format!("/l/{id}")),
            Ok((Route::Register, id))
        );
        assert_eq!(
            resolve("GET", &format!("/l/{id}?x=1")),
            Ok((Route::Inspect, id))
        );
        assert_eq!(
            resolve("DELETE", &format!("/l/{id}/")),
            Ok((Route::Delete, id))
        );
        assert_eq!(
            resolve("POST", &format!("/l/{id}/borrow")),
            Ok((Route::Borrow, id))
        );
        assert_eq!(
            resolve("POST", &format!("/l/{id}/return")),
            Ok((Route::Return, id))
        );
        assert_eq!(
            resolve("GET", "/l/not-a-uuid"),
            Ok((Route::Inspect, "not-a-uuid"))
        );
        for path in [
            "/",
            "/l",
            "/l/",
            "/x/1",
            "/prod/l/1",
            &format!("/l/{id}/renew"),
            &format!("/l/{id}/borrow/x"),
        ] {
            assert_eq!(resolve("GET", path), Err(Error::RouteNotFound), "{path}");
        }
        assert_eq!(
            resolve("POST", &format!("/l/{id}")),
            Err(Error::MethodNotAllowed {
                allow: "PUT, GET, DELETE".into()
            })
        );
        assert_eq!(
            resolve("GET", &format!("/l/{id}/borrow")),
            Err(Error::MethodNotAllowed {
                allow: "POST".into()
            })
        );
    }

    #[test]
    fn id_is_found_in_raw_paths() {
        assert_eq!(id_from_path(Route::Inspect, "/l/abc"), Some("abc"));
        assert_eq!(id_from_path(Route::Inspect, "/prod/l/abc/"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/borrow"), Some("abc"));
        assert_eq!(id_from_path(Route::Borrow, "/l/abc/return"), None);
        assert_eq!(id_from_path(Route::Return, "/l/abc"), None);
        assert_eq!(id_from_path(Route::Inspect, "/x/abc"), None);
        assert_eq!(id_from_path(Route::Inspect, "/l/abc/x/y"), None);
    }
}
