//! The two body types that cross the proxy: the request body going upstream ([`ReqBody`]) and
//! the response body going to the client ([`RespBody`]).

mod request;
mod response;
mod throttle;

pub use request::ReqBody;
pub use response::RespBody;
pub use throttle::Throttled;
