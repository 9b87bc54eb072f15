//! A small map from tool names, fast for the few names a layer is configured with.

use std::collections::HashMap;

/// Up to this many names are searched in a list: comparing a few short strings is cheaper
/// than hashing one.
const LINEAR: usize = 8;

/// Values keyed by tool name.
#[derive(Debug, Clone)]
pub(crate) enum ByName<T> {
    Few(Vec<(String, T)>),
    Many(HashMap<String, T>),
}

impl<T> Default for ByName<T> {
    fn default() -> Self {
        ByName::Few(Vec::new())
    }
}

impl<T> ByName<T> {
    /// Set the value of `name`, replacing an earlier one.
    pub(crate) fn insert(&mut self, name: String, value: T) {
        match self {
            ByName::Few(list) => {
                if let Some(slot) = list.iter_mut().find(|(n, _)| *n == name) {
                    slot.1 = value;
                } else if list.len() < LINEAR {
                    list.push((name, value));
                } else {
                    let mut map: HashMap<String, T> = std::mem::take(list).into_iter().collect();
                    map.insert(name, value);
                    *self = ByName::Many(map);
                }
            }
            ByName::Many(map) => {
                map.insert(name, value);
            }
        }
    }

    /// The value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&T> {
        match self {
            ByName::Few(list) => list.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            ByName::Many(map) => map.get(name),
        }
    }

    /// The names and values, in no particular order.
    pub(crate) fn iter(&self) -> Box<dyn Iterator<Item = (&str, &T)> + '_> {
        match self {
            ByName::Few(list) => Box::new(list.iter().map(|(n, v)| (n.as_str(), v))),
            ByName::Many(map) => Box::new(map.iter().map(|(n, v)| (n.as_str(), v))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_names_move_to_a_map_and_stay_found() {
        let mut names = ByName::default();
        for i in 0..20 {
            names.insert(format!("t{i}"), i);
        }
        names.insert("t3".into(), 33);
        assert!(matches!(names, ByName::Many(_)));
        assert_eq!(names.get("t3"), Some(&33));
        assert_eq!(names.get("t19"), Some(&19));
        assert_eq!(names.get("nope"), None);
        assert_eq!(names.iter().count(), 20);
    }
}
