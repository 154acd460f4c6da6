use strict; use warnings;
my $n = shift // 500000;
my %h;
my $x = 12345;
for my $i (0 .. $n - 1) { $x = ($x * 1103515245 + 12345) % 2147483648; $h{"key$i"} = "v" . $x . ("x" x 64); }
my $sum = 0;
for my $r (0 .. 2 * $n - 1) { $x = ($x * 1103515245 + 12345) % 2147483648; my $k = "key" . ($x % $n); $sum = ($sum * 31 + length($h{$k}) + ord(substr($h{$k}, 1, 1))) % 1000000007; }
print "perl $n keys checksum $sum\n";
