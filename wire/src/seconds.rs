//! Durations as the API writes them: seconds as a JSON number, kept to the
//! millisecond, an integer when whole (`30`, `1.5`).

use std::fmt;
use std::time::Duration;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A duration in whole milliseconds, written as seconds.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seconds {
    ms: u64,
}

impl Seconds {
    pub const ZERO: Seconds = Seconds { ms: 0 };
    pub const MAX: Seconds = Seconds { ms: u64::MAX };

    pub const fn from_millis(ms: u64) -> Seconds {
        Seconds { ms }
    }

    /// To the millisecond, rounded down; saturating.
    pub fn from_duration(duration: Duration) -> Seconds {
        Seconds::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// A JSON number of seconds: rounded to the millisecond, saturating;
    /// `None` when negative or not finite.
    pub fn from_secs_f64(seconds: f64) -> Option<Seconds> {
        if !seconds.is_finite() || seconds < 0.0 {
            return None;
        }
        let ms = (seconds * 1000.0).round();
        Some(Seconds::from_millis(if ms >= u64::MAX as f64 {
            u64::MAX
        } else {
            ms as u64
        }))
    }

    pub const fn as_millis(self) -> u64 {
        self.ms
    }

    pub const fn as_duration(self) -> Duration {
        Duration::from_millis(self.ms)
    }

    pub fn as_secs_f64(self) -> f64 {
        self.ms as f64 / 1000.0
    }
}

impl From<Duration> for Seconds {
    fn from(duration: Duration) -> Seconds {
        Seconds::from_duration(duration)
    }
}

impl From<Seconds> for Duration {
    fn from(seconds: Seconds) -> Duration {
        seconds.as_duration()
    }
}

/// For people: `5 s`, `0.25 s`.
impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ms.is_multiple_of(1000) {
            write!(f, "{} s", self.ms / 1000)
        } else {
            let text = format!("{:.3}", self.as_secs_f64());
            write!(f, "{} s", text.trim_end_matches('0'))
        }
    }
}

impl fmt::Debug for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.ms.is_multiple_of(1000) {
            serializer.serialize_u64(self.ms / 1000)
        } else {
            serializer.serialize_f64(self.as_secs_f64())
        }
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Seconds, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        Seconds::from_secs_f64(seconds)
            .ok_or_else(|| de::Error::custom("a number of seconds, 0 or more"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_seconds_are_integers_and_fractions_keep_milliseconds() {
        let json = |ms| serde_json::to_value(Seconds::from_millis(ms)).unwrap();
        assert_eq!(json(30_000), json!(30));
        assert_eq!(json(1_500), json!(1.5));
        assert_eq!(json(0), json!(0));
        assert_eq!(
            Seconds::from_duration(Duration::from_micros(200)),
            Seconds::ZERO
        );
        assert_eq!(Seconds::from_secs_f64(0.0004), Some(Seconds::ZERO));
        assert_eq!(
            Seconds::from_secs_f64(0.0005),
            Some(Seconds::from_millis(1))
        );
        assert_eq!(Seconds::from_secs_f64(1e300), Some(Seconds::MAX));
        assert_eq!(Seconds::from_secs_f64(-0.1), None);
        assert_eq!(Seconds::from_secs_f64(f64::NAN), None);
        let parsed: Seconds = serde_json::from_value(json!(2)).unwrap();
        assert_eq!(parsed.as_millis(), 2000);
        assert!(serde_json::from_value::<Seconds>(json!("2")).is_err());
    }

    #[test]
    fn people_read_seconds() {
        assert_eq!(Seconds::from_millis(250).to_string(), "0.25 s");
        assert_eq!(Seconds::from_millis(5000).to_string(), "5 s");
        assert_eq!(Seconds::from_millis(1001).to_string(), "1.001 s");
    }
}
