#include <regex>
#include <map>
#include <vector>
#include <string>
#include <iostream>
#include <algorithm>
#include <unordered_map>
#include <sstream>
template <int N> struct F { static constexpr long v = F<N-1>::v * 3 % 1000003 + N; };
template <> struct F<0> { static constexpr long v = 1; };
int main() {
  std::map<std::string, std::vector<int>> m;
  std::regex r("([a-z]+)([0-9]+)");
  std::smatch s; std::string t = "abc123";
  if (std::regex_match(t, s, r)) m[s[1]].push_back(std::stoi(s[2]));
  std::cout << F<400>::v << " " << m.size() << std::endl;
}
