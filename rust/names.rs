//! Names of the rule choices (`Variant`, `Method`, `Children`, `TreeRule`):
//! each type lists (value, name) once in its `TABLE`; parsing, printing and
//! the lists Python exports all read that table.

use crate::error::{Result, SpecError};

/// A choice named by a fixed table of (value, name).
pub trait Named: Copy + PartialEq + Sized + 'static {
    /// What the names name, for error messages, e.g. "variant".
    const WHAT: &'static str;
    /// Every value with its name, in the order they are listed.
    const TABLE: &'static [(Self, &'static str)];

    /// The value's name ("" cannot happen: every value is in the table).
    fn name(self) -> &'static str {
        Self::TABLE.iter().find(|(v, _)| *v == self).map_or("", |(_, n)| n)
    }

    /// The names in table order.
    fn names() -> impl Iterator<Item = &'static str> {
        Self::TABLE.iter().map(|(_, n)| *n)
    }

    /// The value named `s`, or an error listing every name.
    fn parse_name(s: &str) -> Result<Self> {
        Self::TABLE
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(v, _)| *v)
            .ok_or_else(|| {
                SpecError::Invalid(format!(
                    "unknown {} {s:?}; expected one of {}",
                    Self::WHAT,
                    Self::names().collect::<Vec<_>>().join(", ")
                ))
            })
    }
}

/// `FromStr` for `Named` types (`"exact".parse::<Variant>()`).
macro_rules! from_name {
    ($($t:ty),+) => {$(
        impl std::str::FromStr for $t {
            type Err = $crate::error::SpecError;
            fn from_str(s: &str) -> $crate::error::Result<Self> {
                <$t as $crate::names::Named>::parse_name(s)
            }
        }
    )+};
}
pub(crate) use from_name;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Children, Method, TreeRule, Variant};

    fn round_trip<T: Named + std::fmt::Debug>() {
        for &(v, n) in T::TABLE {
            assert_eq!(T::parse_name(n).unwrap(), v);
            assert_eq!(v.name(), n);
        }
        let err = T::parse_name("no such name").unwrap_err().to_string();
        assert!(err.contains(T::WHAT) && err.contains(T::TABLE[0].1), "{err}");
    }

    #[test]
    fn every_table_round_trips_and_names_its_choices_on_error() {
        round_trip::<Variant>();
        round_trip::<Method>();
        round_trip::<Children>();
        round_trip::<TreeRule>();
    }
}
