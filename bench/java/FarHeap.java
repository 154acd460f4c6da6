import java.util.HashMap;
import java.util.Random;

/**
 * The Java workload of bench/codec.py: N byte arrays of SIZE bytes (default 300000 x 1 KiB), each
 * filled from java.util.Random (seed 42), kept in a HashMap<Integer, byte[]>; then two
 * System.gc() calls, and a pass that reads every array back into a checksum, printed at the end:
 *
 *     checksum <16 hex digits> over N objects in T s
 *
 * (the line bench/vs_swap.py's demo parser reads). Deterministic: same N, SIZE, same checksum.
 * Usage: java -cp DIR FarHeap [N [SIZE]]
 */
public class FarHeap {
    public static void main(String[] args) {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 300000;
        int size = args.length > 1 ? Integer.parseInt(args[1]) : 1024;
        long t0 = System.nanoTime();
        Random rnd = new Random(42);
        HashMap<Integer, byte[]> map = new HashMap<>();
        for (int i = 0; i < n; i++) {
            byte[] b = new byte[size];
            rnd.nextBytes(b);
            map.put(i, b);
        }
        System.gc();
        System.gc();
        long sum = 0;
        for (int i = 0; i < n; i++) {
            byte[] b = map.get(i);
            if (b == null || b.length != size) {
                System.err.println("FarHeap: array " + i + " missing or resized");
                System.exit(1);
            }
            for (int j = 0; j < size; j++) {
                sum = sum * 1099511628211L + (b[j] & 0xff);
            }
        }
        double s = (System.nanoTime() - t0) / 1e9;
        System.out.printf("checksum %016x over %d objects in %.2f s%n", sum, map.size(), s);
    }
}
